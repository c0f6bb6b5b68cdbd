"""Interpolating language models per token (lmpipe/combine.py)."""

import numpy as np

from lmpipe.combine import combinations, fit_weights, mixture_logprobs, score
from lmpipe.splits import Split


def split(n: int, name: str = "test") -> Split:
    return Split(name, np.zeros(n, dtype=np.uint16), words=n // 2, bytes=3 * n)


def test_a_weight_of_one_gives_back_the_single_model_bit_for_bit():
    rng = np.random.default_rng(0)
    a, b = np.log(rng.uniform(1e-6, 1, (2, 5000))).astype(np.float32)
    mixed = mixture_logprobs(np.stack([a, b]), np.array([1.0, 0.0]))
    assert np.array_equal(mixed, a.astype(np.float64))
    assert score(mixed, split(5000)) == score(a, split(5000))


def test_weights_fitted_on_a_synthetic_mixture_are_recovered():
    rng = np.random.default_rng(1)
    vocab, n = 50, 200_000
    p1, p2 = rng.dirichlet(np.ones(vocab), size=2)
    tokens = rng.choice(vocab, size=n, p=0.3 * p1 + 0.7 * p2)
    weights = fit_weights(np.log(np.stack([p1[tokens], p2[tokens]])))
    np.testing.assert_allclose(weights, [0.3, 0.7], atol=0.02)
    assert abs(weights.sum() - 1) < 1e-12


def test_the_mixture_is_never_worse_on_valid_than_its_best_part():
    rng = np.random.default_rng(2)
    parts = np.log(rng.dirichlet(np.ones(30), size=3)[:, rng.integers(0, 30, 20_000)])
    weights = fit_weights(parts)
    assert mixture_logprobs(parts, weights).mean() >= parts.mean(axis=1).max() - 1e-12


def test_combinations_are_each_model_with_the_baseline_the_best_pair_and_all():
    rng = np.random.default_rng(3)
    truth = rng.dirichlet(np.ones(40), size=1)[0]
    splits = {"valid": split(4000, "valid"), "test": split(4000)}
    tokens = {s: rng.choice(40, size=4000, p=truth) for s in splits}
    noisy = {name: rng.dirichlet(np.ones(40) * k) for name, k in (("gru", 50.0), ("lstm", 40.0), ("nplm", 2.0),
                                                                    ("ngram", 5.0))}
    logprobs = {name: {s: np.log(p[tokens[s]]).astype(np.float32) for s in splits} for name, p in noisy.items()}
    rows = combinations(logprobs, splits)
    pairs = [n for n in rows if "ngram" not in n]
    assert {"gru+ngram", "lstm+ngram", "nplm+ngram", "gru+lstm+ngram+nplm"} <= set(rows) and len(pairs) == 1
    assert set(rows) == {"gru+ngram", "lstm+ngram", "nplm+ngram", pairs[0], "gru+lstm+ngram+nplm"}
    assert set(rows["gru+ngram"]) == {"weights", "valid", "test"}
    assert set(rows["gru+ngram"]["test"]) == {"loss", "ppl", "word_ppl", "bpb"}
    assert abs(sum(rows["gru+lstm+ngram+nplm"]["weights"].values()) - 1) < 1e-9
    nplm_alone = score(logprobs["nplm"]["valid"], splits["valid"])["loss"]
    assert rows["nplm+ngram"]["valid"]["loss"] <= nplm_alone + 1e-12  # fitted on valid: never worse there
