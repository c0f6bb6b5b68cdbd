"""Word Embedding Association Test (Caliskan, Bryson & Narayanan, Science 2017), vectorised.

s(w, A, B) = mean_a cos(w, a) - mean_b cos(w, b); statistic S = sum_x s(x) - sum_y s(y);
effect size d = (mean_x s - mean_y s) / std_{w in X u Y} s(w) (sample std); one-sided p-value =
share of equal-size re-partitions (X_i, Y_i) of X u Y with S(X_i, Y_i) > S(X, Y) - all of them when
there are at most `max_permutations`, else that many seeded random ones. One cosine matrix, the
partitions as an index matrix: no Python loop per permutation.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class WeatResult:
    effect_size: float
    p_value: float
    statistic: float
    n_permutations: int
    exact: bool


def _unit(vectors: np.ndarray, what: str) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float64)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    if np.any(norms == 0):
        raise ValueError(f"{what} has a zero vector: its cosine is undefined (drop the word or check its embedding)")
    return vectors / norms


def associations(targets: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """s(w, A, B) for every row w of `targets`."""
    t = _unit(targets, "a target set")
    return (t @ _unit(a, "attribute set A").T).mean(1) - (t @ _unit(b, "attribute set B").T).mean(1)


def partitions(n: int, k: int, max_permutations: int, rng: np.random.Generator) -> tuple[np.ndarray, bool]:
    """Index matrix of the first-set members of equal-size re-partitions of range(n): exact or sampled."""
    if math.comb(n, k) <= max_permutations:
        flat = np.fromiter(itertools.chain.from_iterable(itertools.combinations(range(n), k)), dtype=np.int32)
        return flat.reshape(-1, k), True
    return np.argsort(rng.random((max_permutations, n)), axis=1)[:, :k].astype(np.int32), False


def weat(x: np.ndarray, y: np.ndarray, a: np.ndarray, b: np.ndarray, max_permutations: int = 100_000,
         seed: int = 0) -> WeatResult:
    """The WEAT effect size and one-sided permutation p-value for target sets X, Y and attributes A, B."""
    s = associations(np.vstack([x, y]), a, b)
    nx = len(x)
    sx, sy = s[:nx], s[nx:]
    effect = (sx.mean() - sy.mean()) / s.std(ddof=1)
    statistic = sx.sum() - sy.sum()
    index, exact = partitions(len(s), nx, max_permutations, np.random.default_rng(seed))
    permuted = 2 * s[index].sum(axis=1) - s.sum()  # S(X_i, Y_i) = sum_Xi s - (total - sum_Xi s)
    tolerance = 1e-12 * max(1.0, abs(statistic))  # the identity partition must not count as "greater"
    p = float(np.mean(permuted > statistic + tolerance))
    return WeatResult(float(effect), p, float(statistic), len(index), exact)
