"""Model FLOPs utilisation of the transformer at a few sizes: lmpipe's Trainer, achieved FLOP/s over the device's peak.

    python benchmarks/mfu.py                 # sizes for the device found (GPU: up to 12 x 768; CPU: small ones)
    python benchmarks/mfu.py --steps 200 --compile
    python benchmarks/mfu.py --sizes 16x1x2 --steps 4 --batch 2 --seq-len 16   # sizes of your own: DIMxLAYERSxHEADS

FLOPs are lmpipe.flops' analytic count (the same the trainer and the scaling grid record); the peak is the
dense bf16 tensor-core figure of lmpipe.flops.PEAK_BF16_FLOPS for the device's name. On a CPU there is no peak
in the table, so only FLOP/s is printed. "whole run" counts every training second (with torch.compile, its
compilation in the first steps); "last quarter" is the rate between the last two of four evaluations, the steady
state (each quarter is one short epoch). Needs the default corpus tokens (dvc repro tokenize).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lmpipe.config import load_params  # noqa: E402
from lmpipe.flops import peak_flops  # noqa: E402
from lmpipe.splits import load_tokens  # noqa: E402
from lmpipe.train import Trainer, configure_run, setup_process  # noqa: E402

GPU_SIZES = [(256, 4, 4), (512, 8, 8), (768, 12, 12)]  # (dim, layers, heads)
CPU_SIZES = [(64, 2, 4), (128, 4, 4), (256, 4, 4)]


def size(text: str) -> tuple[int, int, int]:
    """'DIMxLAYERSxHEADS' -> (dim, layers, heads)."""
    try:
        dim, layers, heads = (int(v) for v in text.split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: DIMxLAYERSxHEADS, e.g. 128x4x4") from None
    return dim, layers, heads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100, help="optimiser steps per size")
    parser.add_argument("--batch", type=int, default=0, help="sequences per step (default: 64 on a GPU, 16 on a CPU)")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--compile", action="store_true", help="torch.compile the model (worth it on a GPU)")
    parser.add_argument("--sizes", nargs="+", type=size, metavar="DIMxLAYERSxHEADS",
                        help="the sizes timed (default: the device's, above)")
    args = parser.parse_args()
    params, data = load_params(), load_tokens()
    gpu = torch.cuda.is_available()
    name = torch.cuda.get_device_name() if gpu else "cpu"
    peak = peak_flops(name) if gpu else None
    batch = args.batch or (64 if gpu else 16)
    print(f"device: {name}; bf16 peak: {f'{peak / 1e12:.0f} TFLOP/s' if peak else 'not in the table'}; "
          f"batch {batch} x {args.seq_len}, {args.steps} steps, compile {args.compile}")
    print(f"{'size':>10} {'params':>11} | whole run: {'tokens/s':>10} {'TFLOP/s':>8} {'MFU':>6} "
          f"| last quarter: {'tokens/s':>10} {'TFLOP/s':>8} {'MFU':>6}")
    for dim, layers, heads in args.sizes or (GPU_SIZES if gpu else CPU_SIZES):
        settings, common = configure_run(
            params, "transformer",
            {"arch.dim": dim, "arch.layers": layers, "arch.heads": heads, "arch.block_size": args.seq_len,
             "arch.dropout": 0.0, "batch_size": batch, "seq_len": args.seq_len, "optim.warmup_steps": 0,
             "epochs": 4, "patience": 3,
             "max_steps_per_epoch": max(args.steps // 4, 1)},  # four evaluations: the last quarter timed
            None, {"compile": args.compile, "evals_per_epoch": 1})
        with tempfile.TemporaryDirectory() as ckpt:
            run = Trainer("transformer", settings, common, data, ckpt, setup_process(common), progress_bar=False).run()
            m, last = run.metrics, run.history[-1]
        rates = [(m["tokens_per_sec"], m["flops_per_sec"]),
                 (last["tokens_per_sec"], last["tokens_per_sec"] * m["flops_per_token"])]
        print(f"{f'{layers} x {dim}':>10} {m['n_params']:>11,} | " + " | ".join(
            f"{'':>11}{tokens:>10,.0f} {flops / 1e12:>8.3f} {f'{100 * flops / peak:.1f}%' if peak else '-':>6}"
            for tokens, flops in rates), flush=True)


if __name__ == "__main__":
    main()
