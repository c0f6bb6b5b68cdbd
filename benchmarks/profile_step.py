"""Where a training step of one of the study's models spends its time on this machine (torch.profiler).

    python benchmarks/profile_step.py                        # the study's transformer, its own stage settings
    python benchmarks/profile_step.py --model gru --steps 40

The model, batch, precision and optimiser are the train stage's (lmpipe.train.configure_run on params.yaml), on the
default corpus's tokens (dvc repro tokenize). After --warmup steps it profiles --steps more of the Trainer's own
loop and prints: the step's FLOP/s (lmpipe.flops' count), then the CPU time by operator, grouped into the parts of
a step (the optimisers, attention, the loss, the other matmuls, dropout, autocast's casts, the rest), largest
first, and the operators that take most.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lmpipe.config import load_params  # noqa: E402
from lmpipe.splits import load_tokens  # noqa: E402
from lmpipe.train import Trainer, configure_run, setup_process  # noqa: E402

PARTS = (  # operator name fragments -> the part of a step they belong to (first match wins), outside the optimiser
    ("attention", ("scaled_dot_product", "attention", "_flash", "bmm")),
    ("loss (log-softmax over the vocabulary)", ("cross_entropy", "log_softmax", "nll_loss")),
    ("matmul", ("mm", "matmul", "linear", "addmm")),
    ("dropout", ("bernoulli", "dropout")),
    ("casts and copies (autocast)", ("copy_", "_to_copy", "to")),
)


def part_of(event) -> str:
    """The part of the step an operator's own time belongs to: the optimiser step it runs in, else its kind."""
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("Optimizer.step#"):
            return f"optimiser: {parent.name.split('#')[1].removesuffix('.step')}"
        parent = parent.cpu_parent
    name = event.name.lower()
    return next((part for part, keys in PARTS if any(k in name for k in keys)), "other elementwise and norms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="transformer")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--top", type=int, default=15, help="operators listed")
    args = parser.parse_args()
    params, data = load_params(), load_tokens()
    steps = args.warmup + args.steps
    run_settings = {"epochs": 1, "patience": 3, "max_steps_per_epoch": steps + 1}
    settings, common = configure_run(params, args.model, run_settings, None,
                                     {"evals_per_epoch": 1, "checkpoint_every": 10**9}, "params.yaml")
    prof = profile(activities=[ProfilerActivity.CPU])
    times: list[float] = []
    clock = [time.perf_counter()]

    def on_step(step: int) -> None:  # the profile covers steps warmup+1 .. warmup+steps: no evaluation, no compile
        now = time.perf_counter()
        times.append(now - clock[0])
        clock[0] = now
        if step == args.warmup:
            prof.__enter__()
        elif step == steps:
            prof.__exit__(None, None, None)

    with tempfile.TemporaryDirectory() as ckpt:
        device = setup_process(common)
        trainer = Trainer(args.model, settings, common, data, ckpt, device, progress_bar=False)
        flops_per_step = trainer.flops_per_token * settings.batch_size * settings.seq_len
        trainer.run(on_step=on_step)
    times = times[args.warmup:steps]
    steady = sorted(times)[len(times) // 2]
    print(f"{args.model}: {settings.batch_size} x {settings.seq_len} tokens a step, {flops_per_step / 1e9:.2f} GFLOP; "
          f"median step {steady * 1e3:.1f} ms = {flops_per_step / steady / 1e9:.1f} GFLOP/s "
          f"({torch.get_num_threads()} threads, {'bf16' if trainer.autocast else 'fp32'})")
    events = [e for e in prof.events() if e.name.startswith("aten::")]
    total = sum(e.self_cpu_time_total for e in events) or 1
    parts = defaultdict(float)
    for e in events:
        parts[part_of(e)] += e.self_cpu_time_total
    print("self CPU time of the aten operators, by part of the step:")
    for part, t in sorted(parts.items(), key=lambda kv: -kv[1]):
        print(f"  {part:40s} {100 * t / total:5.1f}%  {t / args.steps / 1e3:7.2f} ms/step")
    print(f"top {args.top} operators:")
    for e in sorted((e for e in prof.key_averages() if e.key.startswith("aten::")),
                    key=lambda e: -e.self_cpu_time_total)[: args.top]:
        print(f"  {e.key:45s} {100 * e.self_cpu_time_total / total:5.1f}%  {e.count // args.steps:4d} calls/step")


if __name__ == "__main__":
    main()
