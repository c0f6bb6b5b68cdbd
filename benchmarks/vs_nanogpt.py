"""lmpipe's Trainer beside nanoGPT's model.py at the same shapes: steady-state training tokens/s and their ratio.

    python benchmarks/vs_nanogpt.py --nanogpt DIR        # DIR holds karpathy/nanoGPT's model.py
    python benchmarks/vs_nanogpt.py                      # clones karpathy/nanoGPT into a temporary folder (network)
    python benchmarks/vs_nanogpt.py --layers 12 --dim 768 --heads 12 --seq-len 1024 --batch 16 --compile  # a GPU

nanoGPT's code is fetched at benchmark time and never committed. Both train on the default corpus's tokens (dvc
repro tokenize; vocabulary 8192) with bf16 autocast where the device computes it natively, dropout 0 (--dropout sets
lmpipe's alone, e.g. the study's 0.2 with --before; nanoGPT's would drop attention weights too, SDPA's slow path on a
CPU, so the ratio to nanoGPT is like for like at 0 only):
- nanoGPT as its train.py does: `GPT(GPTConfig(bias=False))`, its `configure_optimizers` (AdamW, fused on CUDA,
  weight decay 0.1, betas 0.9/0.95), clip 1.0, batches at random offsets copied pinned and non-blocking;
- lmpipe's Trainer with the study's transformer recipe (params.yaml `models.transformer`: rotary positions, ReLU^2,
  Muon on the hidden matrices) at the same shapes, or GPT-2's (`--recipe gpt2`: learned positions, GELU, AdamW).
Each side runs --rounds times, alternating. nanoGPT's round times --steps steps after --warmup (torch.compile
compiles there); lmpipe's is the Trainer's own rate over a second epoch of as many steps, after a first that warms
up (evaluation excluded). Prints each
round's tokens/s, the medians and lmpipe / nanoGPT (the target on a GPU: >= 0.95 at 12 x 768, T 1024, B 16).
With --before, each round also times lmpipe's transformer as it was before 2026-11-30 (attention by SDPA under
autocast: its bf16 kernel on a bf16 CPU, see lmpipe.models.transformer.attend; dropout masks from `bernoulli_`) and
prints now / before: the same FLOPs a token, so the ratio of tokens/s is the ratio of FLOP/s.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lmpipe.config import load_params  # noqa: E402
from lmpipe.flops import train_flops_per_token  # noqa: E402
from lmpipe.models import transformer  # noqa: E402
from lmpipe.splits import load_tokens  # noqa: E402
from lmpipe.train import Trainer, autocast_dtype, configure_run, setup_process  # noqa: E402

NANOGPT = "https://github.com/karpathy/nanoGPT"
GPT2_RECIPE = {"arch.position": "learned", "arch.mlp": "gelu", "optim.name": "adamw", "optim.lr": 6e-4,
               "optim.weight_decay": 0.1}


def nanogpt_module(folder: str | None, scratch: Path):
    """nanoGPT's model.py as a module: from --nanogpt, else cloned now (never part of this repository)."""
    if folder is None:
        folder = scratch / "nanoGPT"
        subprocess.run(["git", "clone", "--depth", "1", "--quiet", NANOGPT, str(folder)], check=True)
    spec = importlib.util.spec_from_file_location("nanogpt_model", Path(folder) / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def nanogpt_rate(module, args, tokens: np.ndarray, device: torch.device) -> float:
    """Tokens/s of nanoGPT's model and optimiser over --steps steps after --warmup."""
    torch.manual_seed(0)
    config = module.GPTConfig(block_size=args.seq_len, vocab_size=args.vocab, n_layer=args.layers, n_head=args.heads,
                              n_embd=args.dim, dropout=0.0, bias=False)
    model = module.GPT(config).to(device)
    optimizer = model.configure_optimizers(0.1, 6e-4, (0.9, 0.95), device.type)
    step_model = torch.compile(model) if args.compile else model
    data = torch.from_numpy(tokens.astype(np.int64))
    rng = np.random.default_rng(0)
    dtype = autocast_dtype("auto", device)

    def batch():
        starts = torch.from_numpy(rng.integers(0, len(data) - args.seq_len - 1, args.batch))
        rows = torch.stack([data[s:s + args.seq_len + 1] for s in starts.tolist()])
        if device.type == "cuda":
            rows = rows.pin_memory().to(device, non_blocking=True)
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()  # as get_batch stacks x and y apart

    def step(x, y):
        with torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            _, loss = step_model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    x, y = batch()
    for _ in range(args.warmup):
        step(x, y)
        x, y = batch()
    sync(device)
    started = time.perf_counter()
    for _ in range(args.steps):
        step(x, y)
        x, y = batch()
    sync(device)
    return args.steps * args.batch * args.seq_len / (time.perf_counter() - started)


def lmpipe_rate(args, params, data) -> float:
    """Tokens/s of lmpipe's Trainer between its last two evaluations (the steady state, evaluation excluded)."""
    changes = {"arch.dim": args.dim, "arch.layers": args.layers, "arch.heads": args.heads,
               "arch.block_size": args.seq_len, "arch.dropout": args.dropout, "batch_size": args.batch,
               "seq_len": args.seq_len, "optim.warmup_steps": 0, "epochs": 2, "patience": 3,
               "max_steps_per_epoch": args.warmup + args.steps}
    if args.recipe == "gpt2":
        changes.update(GPT2_RECIPE)
    settings, common = configure_run(params, "transformer", changes, None,
                                      {"compile": args.compile, "evals_per_epoch": 1, "checkpoint_every": 10**9})
    with tempfile.TemporaryDirectory() as ckpt:
        run = Trainer("transformer", settings, common, data, ckpt, setup_process(common), progress_bar=False).run()
    return run.history[-1]["tokens_per_sec"]  # the second epoch: after the first's warm-up and compilation


def _qkv_before(self, x: torch.Tensor, rope: tuple | None):
    """transformer.Block._qkv before 2026-11-30: queries and keys rotated one after the other."""
    b, t, d = x.shape
    q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
    if self.qk_norm:
        q, k = F.rms_norm(q, (q.size(-1),)), F.rms_norm(k, (k.size(-1),))
    if rope is not None:
        q, k = transformer.rotary(q, *rope), transformer.rotary(k, *rope)
    return q, k, v


def before_rate(args, params, data) -> float:
    """lmpipe_rate with the transformer as it was before 2026-11-30: SDPA under the training step's autocast (its
    bf16 kernel on a bf16 CPU), queries and keys rotated apart, nn.Dropout's own masks."""
    now = transformer.attend, transformer.Block._qkv, transformer.Dropout.forward
    transformer.attend = lambda q, k, v, causal: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    transformer.Block._qkv = _qkv_before
    transformer.Dropout.forward = torch.nn.Dropout.forward
    try:
        return lmpipe_rate(args, params, data)
    finally:
        transformer.attend, transformer.Block._qkv, transformer.Dropout.forward = now


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nanogpt", help="a folder holding nanoGPT's model.py (default: clone it now)")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=30, help="timed steps per round")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps before them (compilation)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--recipe", choices=("study", "gpt2"), default="study")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--dropout", type=float, default=0.0,
                        help="lmpipe's dropout (the study's: 0.2); nanoGPT's stays 0")
    parser.add_argument("--before", action="store_true", help="also time lmpipe's transformer as it was before "
                                                              "2026-11-30 (CPU, eager: the changes are CPU paths)")
    args = parser.parse_args()
    params, data = load_params(), load_tokens()
    args.vocab = data.vocab_size
    device = setup_process(params.train)
    with tempfile.TemporaryDirectory() as scratch:
        module = nanogpt_module(args.nanogpt, Path(scratch))
        name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
        print(f"device {name}; {args.layers} x {args.dim}, {args.heads} heads, T {args.seq_len}, B {args.batch}, "
              f"V {args.vocab}; dropout {args.dropout}; lmpipe recipe {args.recipe}; compile {args.compile}; "
              f"{args.steps} steps a round")
        ours, theirs, before = [], [], []
        for round_ in range(args.rounds):
            theirs.append(nanogpt_rate(module, args, data.splits["train"].tokens, device))
            ours.append(lmpipe_rate(args, params, data))
            if args.before:
                before.append(before_rate(args, params, data))
            print(f"round {round_ + 1}: nanoGPT {theirs[-1]:,.0f} tokens/s, lmpipe {ours[-1]:,.0f} tokens/s, "
                  f"ratio {ours[-1] / theirs[-1]:.2f}"
                  + (f"; lmpipe before {before[-1]:,.0f} tokens/s, now / before {ours[-1] / before[-1]:.2f}"
                     if before else ""), flush=True)
    per_token = train_flops_per_token("transformer", {"dim": args.dim, "layers": args.layers, "mlp": "gelu"},
                                      args.vocab, args.seq_len)  # the matmuls of both models: the same count
    print(f"median: nanoGPT {statistics.median(theirs):,.0f}, lmpipe {statistics.median(ours):,.0f} tokens/s; "
          f"lmpipe / nanoGPT {spread(ours, theirs)}; at {per_token / 1e6:.1f} MFLOP a token (lmpipe.flops, for "
          f"both): nanoGPT {statistics.median(theirs) * per_token / 1e9:.0f}, lmpipe "
          f"{statistics.median(ours) * per_token / 1e9:.0f} GFLOP/s")
    if before:
        print(f"lmpipe before: {statistics.median(before):,.0f} tokens/s "
              f"({statistics.median(before) * per_token / 1e9:.0f} GFLOP/s); now / before {spread(ours, before)}")


def spread(numerators: list[float], denominators: list[float]) -> str:
    """The median ratio of paired rounds, and their range."""
    ratios = [a / b for a, b in zip(numerators, denominators)]
    return f"{statistics.median(ratios):.2f} (rounds {min(ratios):.2f} to {max(ratios):.2f})"


if __name__ == "__main__":
    main()
