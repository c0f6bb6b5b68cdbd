"""Muon's optimiser step, batched against torch.optim.Muon, on the hidden matrices of params.yaml's models.

    python benchmarks/muon.py                  # the study's transformer, LSTM and GRU, on this machine's device
    python benchmarks/muon.py --steps 400 --models transformer

Both optimisers see the same matrices and the same gradients; they alternate in rounds, so a busy machine slows
both alike, and the printed ratio is torch's seconds per step over lmpipe.muon.BatchedMuon's (> 1: batched is
faster). The update of the two is the same within bf16 rounding (tests/test_muon.py). Needs no data: the models
are built at the study's shapes with params.yaml's vocabulary size.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lmpipe.config import load_params  # noqa: E402
from lmpipe.models import build_model  # noqa: E402
from lmpipe.muon import BatchedMuon  # noqa: E402
from lmpipe.optim import muon_split  # noqa: E402


def seconds_per_step(optimizer, params, grads, steps: int) -> float:
    for p, g in zip(params, grads):
        p.grad = g
    optimizer.step()  # state created outside the clock
    start = time.perf_counter()
    for _ in range(steps):
        optimizer.step()
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["transformer", "lstm", "gru"])
    parser.add_argument("--steps", type=int, default=100, help="optimiser steps per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--params", default="params.yaml", help="the models' settings (a GPU profile: lmpipe profile "
                                                                 "... --write FILE)")
    args = parser.parse_args()
    params = load_params(args.params)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print(f"device: {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}, "
          f"{torch.get_num_threads()} threads; {args.rounds} rounds of {args.steps} steps each")
    for name in args.models:
        settings = params.models[name]
        model = build_model(settings.family, settings.arch, params.tokenizer.vocab_size, 0).to(device)
        matrices, _ = muon_split(model, params.tokenizer.vocab_size)
        shapes = sorted({tuple(p.shape) for p in matrices})
        grads = [torch.randn_like(p) for p in matrices]
        timed = {"torch": [], "batched": []}
        for _ in range(args.rounds):
            for label, kind in (("torch", torch.optim.Muon), ("batched", BatchedMuon)):
                optimizer = kind(matrices, lr=1e-3, weight_decay=0.0, adjust_lr_fn="match_rms_adamw")
                timed[label].append(seconds_per_step(optimizer, matrices, grads, args.steps))
        t, b = statistics.median(timed["torch"]), statistics.median(timed["batched"])
        print(f"{name}: {len(matrices)} matrices in {len(shapes)} shapes; per step torch.optim.Muon "
              f"{t * 1e3:.2f} ms, BatchedMuon {b * 1e3:.2f} ms (medians): {t / b:.2f}x "
              f"(rounds {min(timed['torch']) / max(timed['batched']):.2f}x to {max(timed['torch']) / min(timed['batched']):.2f}x)")


if __name__ == "__main__":
    main()
