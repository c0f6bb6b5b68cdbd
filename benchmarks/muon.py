"""Muon's optimiser step, batched against torch.optim.Muon, on the hidden matrices of params.yaml's models.

    python benchmarks/muon.py                  # the study's transformer, LSTM and GRU, on this machine's device
    python benchmarks/muon.py --steps 400 --models transformer
    python benchmarks/muon.py --training-step  # a whole training step, Muon's chain in bf16 against in fp32

Both optimisers see the same matrices and the same gradients; they alternate in rounds, so a busy machine slows
both alike, and the printed ratio is torch's seconds per step over lmpipe.muon.BatchedMuon's (> 1: batched is
faster). The update of the two is the same within bf16 rounding (tests/test_muon.py). A third column is
BatchedMuon with its chain in fp32, what a run that trains in fp32 uses. --training-step times whole fp32 training
steps (forward, backward, clipping, MuonAdamW) of each model at its batch shape, the chain in bf16 (torch's, and
what the Trainer once ran on every CPU) against fp32, alternating. Needs no data: the models are built at the
study's shapes with params.yaml's vocabulary size, and a step's time does not depend on the tokens.
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
from lmpipe.optim import MuonAdamW, muon_split  # noqa: E402


def seconds_per_step(optimizer, params, grads, steps: int) -> float:
    for p, g in zip(params, grads):
        p.grad = g
    optimizer.step()  # state created outside the clock
    start = time.perf_counter()
    for _ in range(steps):
        optimizer.step()
    return (time.perf_counter() - start) / steps


def training_step_seconds(settings, vocab: int, ns_dtype: torch.dtype, steps: int) -> float:
    """Seconds per fp32 training step of a fresh model at its batch shape, MuonAdamW's chain in `ns_dtype`."""
    torch.manual_seed(0)
    model = build_model(settings.family, settings.arch, vocab, 0).train()
    optimizer = MuonAdamW(model, vocab, settings.optim.lr, settings.optim.weight_decay, ns_dtype)
    x = torch.randint(0, vocab, (settings.batch_size, settings.seq_len))

    def step():
        logits, _, aux = model(x, None)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), x.flatten()) + aux
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), settings.optim.clip)
        optimizer.step()

    step()  # state created outside the clock
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps


def compare_training_steps(params, models: list[str], steps: int, rounds: int) -> None:
    vocab = params.tokenizer.vocab_size
    for name in models:
        timed = {torch.bfloat16: [], torch.float32: []}
        for _ in range(rounds):
            for dtype in timed:
                timed[dtype].append(training_step_seconds(params.models[name], vocab, dtype, steps))
        b, f = statistics.median(timed[torch.bfloat16]), statistics.median(timed[torch.float32])
        print(f"{name}: fp32 training step, Muon's chain in bf16 {b * 1e3:.1f} ms, in fp32 {f * 1e3:.1f} ms "
              f"(medians): {b / f:.2f}x (rounds {min(timed[torch.bfloat16]) / max(timed[torch.float32]):.2f}x to "
              f"{max(timed[torch.bfloat16]) / min(timed[torch.float32]):.2f}x)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["transformer", "lstm", "gru"])
    parser.add_argument("--steps", type=int, default=100, help="optimiser steps per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--params", default="params.yaml", help="the models' settings (a GPU profile: lmpipe profile "
                                                                 "... --write FILE)")
    parser.add_argument("--training-step", action="store_true",
                        help="whole fp32 training steps, Muon's chain in bf16 against fp32 (CPU)")
    args = parser.parse_args()
    params = load_params(args.params)
    if args.training_step:
        print(f"cpu, {torch.get_num_threads()} threads; {args.rounds} rounds of {args.steps} training steps each")
        return compare_training_steps(params, args.models, args.steps, args.rounds)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print(f"device: {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}, "
          f"{torch.get_num_threads()} threads; {args.rounds} rounds of {args.steps} steps each")
    for name in args.models:
        settings = params.models[name]
        model = build_model(settings.family, settings.arch, params.tokenizer.vocab_size, 0).to(device)
        matrices, _ = muon_split(model, params.tokenizer.vocab_size)
        shapes = sorted({tuple(p.shape) for p in matrices})
        grads = [torch.randn_like(p) for p in matrices]
        timed = {"torch": [], "batched": [], "batched fp32": []}
        kinds = (("torch", torch.optim.Muon, {}), ("batched", BatchedMuon, {}),
                 ("batched fp32", BatchedMuon, {"ns_dtype": torch.float32}))
        for _ in range(args.rounds):
            for label, kind, extra in kinds:
                optimizer = kind(matrices, lr=1e-3, weight_decay=0.0, adjust_lr_fn="match_rms_adamw", **extra)
                timed[label].append(seconds_per_step(optimizer, matrices, grads, args.steps))
        t, b, f = (statistics.median(timed[label]) for label, _, _ in kinds)
        print(f"{name}: {len(matrices)} matrices in {len(shapes)} shapes; per step torch.optim.Muon "
              f"{t * 1e3:.2f} ms, BatchedMuon {b * 1e3:.2f} ms (medians): {t / b:.2f}x "
              f"(rounds {min(timed['torch']) / max(timed['batched']):.2f}x to {max(timed['torch']) / min(timed['batched']):.2f}x); "
              f"BatchedMuon with its chain in fp32 {f * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
