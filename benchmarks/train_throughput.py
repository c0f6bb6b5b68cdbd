"""Training tokens/s of each default model: lmpipe's Trainer versus a minimal bare PyTorch loop.

Same model, data, batch shape, optimizer and clipping; the bare loop has no checkpoints, plans,
progress bar or bookkeeping. The ratio is the overhead of everything the trainer adds (target >= 0.95).
Needs the default corpus tokens (dvc repro tokenize). Runs --steps steps of each, alternating, twice.
With --precision, the Trainer in bf16 autocast against the Trainer in fp32 instead (`train.precision`).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lmpipe.config import load_params  # noqa: E402
from lmpipe.models import build_model  # noqa: E402
from lmpipe.splits import load_tokens  # noqa: E402
from lmpipe.train import Trainer, configure_device, pick_device  # noqa: E402


def bare_loop(settings, common, data, steps: int) -> float:
    """The textbook loop: contiguous batches, carried state for recurrent models, AdamW/SGD, clipping."""
    device = pick_device(common.device)
    configure_device(device, common.threads)
    torch.manual_seed(common.seed)
    model = build_model(settings.family, settings.arch, data.vocab_size, data.boundary).to(device).train()
    optim = settings.optim
    if optim.name == "sgd":
        optimizer = torch.optim.SGD(model.parameters(), lr=optim.lr)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=optim.lr, weight_decay=optim.weight_decay)
    tokens = torch.from_numpy(data.splits["train"].tokens.astype("int64"))
    b, t = settings.batch_size, settings.seq_len
    columns = len(tokens) // b
    stream = tokens[: columns * b].view(b, columns)
    state = None
    started = time.perf_counter()
    for step in range(steps):
        start = (step * t) % (columns - t - 1)
        x, y = stream[:, start:start + t].to(device), stream[:, start + 1:start + t + 1].to(device)
        logits, state = model(x, state if model.recurrent else None)
        state = model.detach_state(state)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten()) + model.extra_loss()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), optim.clip)
        optimizer.step()
    float(loss)
    return steps * b * t / (time.perf_counter() - started)


def trainer_loop(name, settings, common, data, steps: int) -> float:  # common.precision as given
    quick = settings.model_copy(update={"epochs": 1, "max_steps_per_epoch": steps, "variable_bptt": False,
                                        "budget": None})  # a budget would run on past the one short epoch
    with tempfile.TemporaryDirectory() as ckpt:
        result = Trainer(name, quick, common, data, ckpt, progress_bar=True).run()
    return result.history[0]["tokens_per_sec"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--models", nargs="*")
    parser.add_argument("--precision", action="store_true", help="bf16 autocast against fp32, both in the Trainer")
    args = parser.parse_args()
    params, data = load_params(), load_tokens()
    names = args.models or list(params.models)
    if args.precision:
        compare_precision(names, params, data, args.steps)
        return
    print(f"{'model':<12} {'lmpipe tok/s':>13} {'bare tok/s':>11} {'ratio':>6}")
    for name in names:
        settings = params.models[name]
        ours, bare = [], []
        for _ in range(2):  # alternate, so drift in machine load hits both
            ours.append(trainer_loop(name, settings, params.train, data, args.steps))
            bare.append(bare_loop(settings, params.train, data, args.steps))
        o, b = max(ours), max(bare)
        print(f"{name:<12} {o:>13.0f} {b:>11.0f} {o / b:>6.2f}")


def compare_precision(names, params, data, steps: int) -> None:
    print(f"{'model':<12} {'fp32 tok/s':>11} {'bf16 tok/s':>11} {'ratio':>6}")
    for name in names:
        runs = {"fp32": [], "bf16": []}
        for _ in range(2):  # alternate, so drift in machine load hits both
            for precision, speeds in runs.items():
                common = params.train.model_copy(update={"precision": precision})
                speeds.append(trainer_loop(name, params.models[name], common, data, steps))
        fp32, bf16 = max(runs["fp32"]), max(runs["bf16"])
        print(f"{name:<12} {fp32:>11.0f} {bf16:>11.0f} {bf16 / fp32:>6.2f}")


if __name__ == "__main__":
    main()
