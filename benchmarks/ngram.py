"""n-gram build and scoring speed and memory: lmpipe versus NLTK's KneserNeyInterpolated, side by side.

Needs the default corpus tokens (dvc repro tokenize). NLTK is far too slow for the whole corpus,
so both run on the same subsample (the first --train-tokens of train, --score-tokens of valid);
lmpipe also runs on the full corpus. NLTK's full-corpus time is extrapolated linearly from the
subsample, which flatters NLTK (its per-query cost grows with the counts it holds).
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lmpipe.ngram import NGramLM  # noqa: E402
from lmpipe.splits import load_tokens  # noqa: E402


def lines(tokens: np.ndarray, boundary: int) -> list[list[str]]:
    out, current = [], []
    for t in tokens.tolist():
        if t == boundary:
            out.append(current)
            current = []
        else:
            current.append(str(t))
    return out + ([current] if current else [])


def run_lmpipe(order, vocab, boundary, train, score):
    tracemalloc.start()
    started = time.perf_counter()
    model = NGramLM(order, vocab, boundary).fit(train)
    build = time.perf_counter() - started
    started = time.perf_counter()
    model.token_log_probs(score)
    scoring = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    return build, scoring, peak


def run_nltk(order, boundary, train, score):
    from nltk.lm import KneserNeyInterpolated
    from nltk.lm.preprocessing import padded_everygram_pipeline

    tracemalloc.start()
    started = time.perf_counter()
    grams, vocab = padded_everygram_pipeline(order, lines(train, boundary))
    model = KneserNeyInterpolated(order)
    model.fit(grams, vocab)
    build = time.perf_counter() - started
    started = time.perf_counter()
    for sentence in lines(score, boundary):
        context = ["<s>"] * (order - 1)
        for word in sentence + ["</s>"]:
            model.logscore(word, context[-(order - 1):] if order > 1 else None)
            context.append(word)
    scoring = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    return build, scoring, peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-tokens", type=int, default=30_000)
    parser.add_argument("--score-tokens", type=int, default=1_000)
    args = parser.parse_args()
    data = load_tokens()
    train, valid = data.splits["train"].tokens, data.splits["valid"].tokens
    sub_train, sub_score = train[: args.train_tokens], valid[: args.score_tokens]
    print(f"corpus: {len(train)} train tokens, {len(valid)} valid tokens, vocab {data.vocab_size}")
    print(f"subsample: {len(sub_train)} train tokens, {len(sub_score)} scored tokens (both libraries)")
    header = f"{'order':>5} {'what':<26} {'build s':>9} {'score s':>9} {'score tok/s':>12} {'peak MiB':>9}"
    for order in (3, 5):
        print("\n" + header)
        ours = run_lmpipe(order, data.vocab_size, data.boundary, sub_train, sub_score)
        theirs = run_nltk(order, data.boundary, sub_train, sub_score)
        full = run_lmpipe(order, data.vocab_size, data.boundary, train, valid)
        rows = [("lmpipe (subsample)", ours, len(sub_score)), ("nltk (subsample)", theirs, len(sub_score)),
                ("lmpipe (full corpus)", full, len(valid))]
        for name, (build, scoring, peak), n in rows:
            print(f"{order:>5} {name:<26} {build:>9.3f} {scoring:>9.3f} {n / scoring:>12.0f} {peak:>9.1f}")
        ratio = (theirs[0] + theirs[1]) / (ours[0] + ours[1])
        scale = len(train) / len(sub_train)
        nltk_full = theirs[0] * scale + theirs[1] / len(sub_score) * len(valid)
        print(f"order {order}: lmpipe is {ratio:.0f}x faster than NLTK at build+score on the same subsample; "
              f"NLTK on the full corpus ~{nltk_full:.0f} s (linear extrapolation) vs lmpipe {full[0] + full[1]:.1f} s "
              f"({nltk_full / (full[0] + full[1]):.0f}x)")
    print(f"\nprocess peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
