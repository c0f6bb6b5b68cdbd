"""Training tokens/s of each default model: lmpipe's Trainer versus a minimal bare PyTorch loop.

Same model, data, batch shape, optimizer and clipping; the bare loop has no checkpoints, plans,
progress bar or bookkeeping. The ratio is the overhead of everything the trainer adds (target >= 0.95).
Needs the default corpus tokens (dvc repro tokenize). Runs --steps steps of each, alternating, twice.
With --precision, the Trainer in bf16 autocast against the Trainer in fp32 instead (`train.precision`).
With --malloc, the bare loop with glibc's freed memory kept in the process (lmpipe.process.keep_freed_memory, what
every stage applies) against glibc's defaults: each run a fresh process, alternating, the median of --rounds;
tokens per CPU-second and minor page faults per step, counted by getrusage around the steps alone.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
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
from lmpipe.train import Trainer, setup_process  # noqa: E402


def bare_loop(settings, common, data, steps: int, usage: dict | None = None) -> float:
    """The textbook loop: contiguous batches, carried state for recurrent models, AdamW/SGD, clipping. Tokens/s;
    `usage` gets the steps' CPU seconds and minor page faults."""
    device = setup_process(common)
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
    started, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    for step in range(steps):
        start = (step * t) % (columns - t - 1)
        x, y = stream[:, start:start + t].to(device), stream[:, start + 1:start + t + 1].to(device)
        logits, state, aux = model(x, state if model.recurrent else None)
        state = model.detach_state(state)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten()) + aux
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), optim.clip)
        optimizer.step()
    float(loss)
    wall, after = time.perf_counter() - started, resource.getrusage(resource.RUSAGE_SELF)
    if usage is not None:
        usage.update(tokens=steps * b * t, cpu=after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime,
                     faults=after.ru_minflt - before.ru_minflt, steps=steps)
    return steps * b * t / wall


def trainer_loop(name, settings, common, data, steps: int) -> float:  # common.precision as given
    quick = settings.model_copy(update={"epochs": 1, "patience": 3, "max_steps_per_epoch": steps,
                                        "variable_bptt": False, "budget": None})  # a budget would run on past the
    # one short epoch; a model on the study's budget states no patience, which epochs need
    with tempfile.TemporaryDirectory() as ckpt:
        result = Trainer(name, quick, common, data, ckpt, setup_process(common), progress_bar=True).run()
    return result.history[0]["tokens_per_sec"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--models", nargs="*")
    parser.add_argument("--precision", action="store_true", help="bf16 autocast against fp32, both in the Trainer")
    parser.add_argument("--malloc", action="store_true", help="freed memory kept by glibc against its defaults")
    parser.add_argument("--rounds", type=int, default=3, help="--malloc: alternations of the two (median)")
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(*args.child, args.steps)
    params = load_params()
    names = args.models or list(params.models)
    if args.malloc:
        compare_malloc(names, args.steps, args.rounds)
        return
    data = load_tokens()
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


def child(name: str, mode: str, steps: int) -> None:
    """One measured run in this fresh process: `kept` applies keep_freed_memory first, `default` does not."""
    from lmpipe.process import keep_freed_memory

    if mode == "kept" and not keep_freed_memory():
        sys.exit("keep_freed_memory: not glibc, nothing to measure")
    params, data, usage = load_params(), load_tokens(), {}
    bare_loop(params.models[name], params.train, data, 3)  # warm-up: first-touch allocations
    bare_loop(params.models[name], params.train, data, steps, usage)
    print(json.dumps(usage))


def compare_malloc(names, steps: int, rounds: int) -> None:
    print(f"{'model':<12} {'default tok/CPU-s':>18} {'kept tok/CPU-s':>15} {'ratio':>6} {'faults/step':>12} {'kept':>7}")
    for name in names:
        runs = {"default": [], "kept": []}
        for _ in range(rounds):  # alternate, so drift in machine load hits both
            for mode, out in runs.items():
                done = subprocess.run([sys.executable, __file__, "--child", name, mode, "--steps", str(steps)],
                                      capture_output=True, text=True, check=True)
                out.append(json.loads(done.stdout.strip().splitlines()[-1]))
        speed = {m: statistics.median(u["tokens"] / u["cpu"] for u in r) for m, r in runs.items()}
        faults = {m: statistics.median(u["faults"] / u["steps"] for u in r) for m, r in runs.items()}
        print(f"{name:<12} {speed['default']:>18.0f} {speed['kept']:>15.0f} {speed['kept'] / speed['default']:>6.2f} "
              f"{faults['default']:>12.0f} {faults['kept']:>7.0f}", flush=True)


if __name__ == "__main__":
    main()
