"""The n-gram build at 10^6..10^8 tokens: lmpipe's bounded-memory build against KenLM's lmplz, same text, same bound.

    python benchmarks/ngram_scale.py --max-tokens 100000000 [--lmplz /path/to/lmplz] [--memory 4GiB] [--workers 0]
    python benchmarks/ngram_scale.py --sizes 20000 --held-out-copies 1      # a size of your own, a short scoring

Streams are relabelled copies of the default train split (data/tokens/train.npy): copy i permutes the token ids
with a seeded permutation that keeps the boundary, so copies share almost no n-grams (pessimistic: a real corpus
of that size repeats far more). For each size, each in a fresh process with its own peak RSS: lmpipe's build
(lmpipe.ngram_build, the ngram stage's code, order 5, modified Kneser-Ney), then the scoring of held-out text (the
valid split relabelled by the same permutations, copy i as train copy i: --held-out-copies, 10: ~850k tokens) through
the memory-mapped model on --workers threads, three times (the first pass also maps the tables' pages; the RSS
counts the pages held: a stretch of one order's tables per thread); with --lmplz, `lmplz -o 5 -S <memory>` on the
same lines (ids as words, one line per boundary) and the build's time and RSS ratios to it. KenLM is not a
dependency of the project: build it from https://github.com/kpu/kenlm.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pydantic import ByteSize, TypeAdapter  # noqa: E402

from lmpipe.splits import load_tokens  # noqa: E402


def relabelled(base: np.ndarray, n: int, vocab: int, boundary: int, seed: int = 0):
    """Yield copies of `base` with ids permuted (boundary fixed) until n tokens; the first copy is `base` itself."""
    rng, others, made = np.random.default_rng(seed), np.delete(np.arange(vocab), boundary), 0
    permutation = np.arange(vocab)
    while made < n:
        piece = permutation[base][: n - made].astype(np.uint16)
        made += len(piece)
        yield piece
        permutation = np.arange(vocab)
        permutation[others] = rng.permutation(others)


def write_text(pieces, path: Path, vocab: int, boundary: int) -> None:
    """lmplz's input: one line per boundary-terminated line, ids as words."""
    names = np.array([str(i) for i in range(vocab)], dtype=object)
    names[boundary] = "\n"
    with open(path, "w") as out:
        for piece in pieces:
            out.write(" ".join(names[piece]).replace(" \n ", "\n").replace(" \n", "\n").replace("\n ", "\n"))


def measure(command: list[str]) -> tuple[float, float, str]:
    """Wall seconds, peak RSS (GiB) and standard output of one child process."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        started = time.perf_counter()
        process = subprocess.Popen(command, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(process.pid, 0)
        seconds = time.perf_counter() - started
        out.seek(0), err.seek(0)
        if os.waitstatus_to_exitcode(status):
            sys.exit(f"{command[0]} failed ({os.waitstatus_to_exitcode(status)}): {err.read().strip()[-2000:]}")
        return seconds, usage.ru_maxrss / 2**20, out.read()


def child(args) -> None:
    """One build, or one scoring of the built model, in this (fresh) process: each gets its own peak RSS."""
    from concurrent.futures import ThreadPoolExecutor

    from lmpipe import ngram_build
    from lmpipe.ngram import NGramLM

    if args.child == "build":
        pool = ThreadPoolExecutor(args.workers)
        plan = ngram_build.build(args.stream, args.model, args.work, 5, args.vocab, args.boundary,
                                 memory=args.memory_bytes, workers=args.workers,
                                 map_tasks=lambda task, jobs: list(pool.map(lambda a: task(*a), jobs)))
        return print(json.dumps(plan))
    model, held_out = NGramLM.load(args.model), np.load(args.held_out)
    speeds = []
    for _ in range(3):  # the first pass also maps the tables' pages into this fresh process
        started = time.perf_counter()
        log_probs = model.token_log_probs(held_out, workers=args.workers)
        speeds.append(len(held_out) / (time.perf_counter() - started))
    print(json.dumps({"score_tok_s": speeds, "n_ngrams": model.n_ngrams,
                      "held_out_ppl": float(np.exp(-log_probs.mean()))}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-tokens", type=float, default=1e7)
    parser.add_argument("--memory", default="4GiB", help="ngram.memory for lmpipe, -S for lmplz")
    parser.add_argument("--workers", type=int, default=0, help="parallel shard tasks and scoring threads; 0 = the cores")
    parser.add_argument("--lmplz", help="path of KenLM's lmplz binary")
    parser.add_argument("--sizes", type=float, nargs="+", help="token counts built (default: 1e6, 1e7, 1e8 up to "
                                                                "--max-tokens)")
    parser.add_argument("--held-out-copies", type=int, default=10, help="relabelled copies of the valid split scored")
    parser.add_argument("--child", choices=("build", "score"), help=argparse.SUPPRESS)
    for name in ("stream", "model", "work", "held-out"):
        parser.add_argument(f"--{name}", help=argparse.SUPPRESS)
    parser.add_argument("--vocab", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--boundary", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--memory-bytes", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.workers = args.workers or os.cpu_count() or 1
    if args.child:
        return child(args)
    memory = int(TypeAdapter(ByteSize).validate_python(args.memory))  # ngram.memory's parsing: 4GiB, 512MiB
    data = load_tokens(ROOT / "data/tokens")
    base, vocab, boundary = data.splits["train"].tokens, data.vocab_size, data.boundary
    sizes = [int(n) for n in args.sizes] if args.sizes else [n for n in (10**6, 10**7, 10**8) if n <= args.max_tokens]
    (ROOT / ".cache").mkdir(exist_ok=True)
    print(f"order 5, memory bound {args.memory}, {args.workers} workers; relabelled copies of the default train split")
    print("| tokens | n-grams | lmpipe build s | build peak RSS GiB | scoring peak RSS GiB | scoring tok/s (first / again) | lmplz s "
          "| lmplz peak RSS GiB | build time / lmplz | build RSS / lmplz |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for n in sizes:
        with tempfile.TemporaryDirectory(dir=ROOT / ".cache") as tmp:
            tmp = Path(tmp)
            np.save(tmp / "stream.npy", np.concatenate(list(relabelled(base, n, vocab, boundary))))
            held = data.splits["valid"].tokens
            np.save(tmp / "held_out.npy", np.concatenate(list(relabelled(held, args.held_out_copies * len(held),
                                                                                  vocab, boundary))))
            common = ["--model", str(tmp / "model"), "--workers", str(args.workers)]
            build_s, build_rss, _ = measure([sys.executable, __file__, "--child", "build", *common,
                                             "--stream", str(tmp / "stream.npy"), "--work", str(tmp / "work"),
                                             "--vocab", str(vocab), "--boundary", str(boundary),
                                             "--memory-bytes", str(memory)])
            os.sync()  # the built model's pages written back first: scoring is measured, not the build's writeback
            _, score_rss, out = measure([sys.executable, __file__, "--child", "score", *common,
                                         "--held-out", str(tmp / "held_out.npy")])
            result = json.loads(out.strip().splitlines()[-1])
            shutil.rmtree(tmp / "model")
            row = [f"{n:.0e}", f"{result['n_ngrams']:,}", f"{build_s:.1f}", f"{build_rss:.2f}", f"{score_rss:.2f}",
                   f"{result['score_tok_s'][0]:,.0f} / {statistics.median(result['score_tok_s'][1:]):,.0f}"]
            if args.lmplz:
                write_text(relabelled(base, n, vocab, boundary), tmp / "text.txt", vocab, boundary)
                (tmp / "lmplz").mkdir()
                kenlm_s, kenlm_rss, _ = measure([args.lmplz, "-o", "5", "--discount_fallback", "-S", f"{memory // 2**20}M", "-T",
                                                 str(tmp / "lmplz"), "--text", str(tmp / "text.txt"),
                                                 "--arpa", str(tmp / "model.arpa")])
                row += [f"{kenlm_s:.1f}", f"{kenlm_rss:.2f}", f"{build_s / kenlm_s:.2f}", f"{build_rss / kenlm_rss:.2f}"]
            else:
                row += ["-"] * 4
            print("| " + " | ".join(row) + " |", flush=True)


if __name__ == "__main__":
    main()
