"""WEAT speed: all ten tests x all audited embeddings with up to 100,000 permutations each.

Uses the real audited vectors in data/embeddings/ when the audit stage has run, else random
vectors of the same sizes (the cost does not depend on the values). Target: well under a minute.

    python benchmarks/weat.py [--permutations 100000]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lmpipe.audit import ROLES, load_tests  # noqa: E402
from lmpipe.weat import weat  # noqa: E402


def embeddings() -> dict[str, dict[str, np.ndarray]]:
    files = sorted(Path("data/embeddings").glob("*.txt"))
    if files:
        from gensim.models import KeyedVectors

        return {f.stem: {w: kv[w] for w in kv.index_to_key}
                for f in files for kv in [KeyedVectors.load_word2vec_format(str(f))]}
    rng = np.random.default_rng(0)
    words = {w for t in load_tests() for r in ROLES for w in t.sets[r]}
    return {f"random-{i}": {w: rng.normal(size=256) for w in words} for i in range(6)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--permutations", type=int, default=100_000, help="most permutations of each test")
    args = parser.parse_args()
    tests, models = load_tests(), embeddings()
    started = time.perf_counter()
    runs = permutations = 0
    for name, vectors in models.items():
        for test in tests:
            sets = [np.array([vectors[w] for w in test.sets[r] if w in vectors]) for r in ROLES]
            if min(len(s) for s in sets) < 2:
                continue
            result = weat(*sets, max_permutations=args.permutations, seed=0)
            runs += 1
            permutations += result.n_permutations
    seconds = time.perf_counter() - started
    print(f"{runs} WEAT runs ({len(models)} embeddings x {len(tests)} tests, covered ones), "
          f"{permutations:,} permutations in all: {seconds:.2f} s ({seconds / max(runs, 1) * 1000:.0f} ms per test)")


if __name__ == "__main__":
    main()
