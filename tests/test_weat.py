"""WEAT: planted bias, exact and sampled p-values against brute force, invariances, bad vectors."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from lmpipe.weat import associations, weat


def planted(rng, n=8, dim=20, strength=3.0):
    """X near A and Y near B: two clusters plus noise."""
    u, v = rng.normal(size=dim), rng.normal(size=dim)
    noise = lambda k: rng.normal(size=(k, dim))  # noqa: E731
    return (strength * u + noise(n), strength * v + noise(n), strength * u + noise(n), strength * v + noise(n))


def test_planted_bias_is_large_significant_and_flips_with_attributes():
    x, y, a, b = planted(np.random.default_rng(0))
    result = weat(x, y, a, b, max_permutations=20_000)
    assert result.effect_size > 1.7 and result.p_value < 0.01  # d is bounded by 2 for two well-separated sets
    flipped = weat(x, y, b, a, max_permutations=20_000)
    assert flipped.effect_size == pytest.approx(-result.effect_size)
    assert flipped.p_value > 0.99


def test_effect_size_reaches_its_analytic_value():
    # s(x) = +c for every x, -c for every y: d = 2c / std over the 2n values = 2c / (c * sqrt(2n/(2n-1))) .
    dim = 4
    a, b = np.eye(dim)[[0]], np.eye(dim)[[1]]
    x, y = np.tile(np.eye(dim)[0], (5, 1)), np.tile(np.eye(dim)[1], (5, 1))
    result = weat(x, y, a, b)
    assert result.effect_size == pytest.approx(2 / np.sqrt(10 / 9))


def test_random_embeddings_give_small_effects():
    rng = np.random.default_rng(1)
    sizes = [abs(weat(*(rng.normal(size=(8, 50)) for _ in range(4)), max_permutations=5000, seed=s).effect_size)
             for s in range(10)]
    p_values = [weat(*(rng.normal(size=(8, 50)) for _ in range(4)), max_permutations=5000).p_value for _ in range(10)]
    assert np.median(sizes) < 0.8
    assert np.median(p_values) > 0.1


def brute_force_p(x, y, a, b):
    s = associations(np.vstack([x, y]), a, b)
    observed = s[: len(x)].sum() - s[len(x):].sum()
    greater = total = 0
    for chosen in itertools.combinations(range(len(s)), len(x)):
        rest = [i for i in range(len(s)) if i not in chosen]
        statistic = sum(s[list(chosen)]) - sum(s[rest])
        greater += statistic > observed + 1e-12
        total += 1
    return greater / total


def test_exact_p_value_equals_brute_force_and_sampled_is_close():
    rng = np.random.default_rng(2)
    x, y, a, b = (rng.normal(size=(5, 6)) + shift for shift in (0.3, 0, 0.3, 0))
    exact = weat(x, y, a, b, max_permutations=1000)
    assert exact.exact and exact.n_permutations == 252
    assert exact.p_value == pytest.approx(brute_force_p(x, y, a, b), abs=1e-12)
    sampled = weat(x, y, a, b, max_permutations=100, seed=3)
    assert not sampled.exact and sampled.n_permutations == 100
    sigma = np.sqrt(exact.p_value * (1 - exact.p_value) / 100)
    assert abs(sampled.p_value - exact.p_value) < 4 * sigma + 0.01


def test_scaling_any_vector_changes_nothing():
    rng = np.random.default_rng(4)
    x, y, a, b = planted(rng, n=6, strength=1.0)
    base = weat(x, y, a, b)
    x2, a2 = x.copy(), a.copy()
    x2[0] *= 17.0
    a2[3] *= 0.01
    scaled = weat(x2, y, a2, b)
    assert scaled.effect_size == pytest.approx(base.effect_size) and scaled.p_value == base.p_value


def test_zero_vector_is_a_clear_error():
    rng = np.random.default_rng(5)
    x, y, a, b = planted(rng, n=4)
    x[2] = 0
    with pytest.raises(ValueError, match="zero vector"):
        weat(x, y, a, b)
