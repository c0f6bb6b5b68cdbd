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


def test_the_cache_is_each_tokens_share_of_the_window_before_it_smoothed_to_a_distribution():
    """cache_logprobs against its definition, computed naively; over the vocabulary it sums to one."""
    from lmpipe.combine import cache_logprobs

    rng = np.random.default_rng(4)
    vocab = 30
    tokens = rng.integers(0, vocab, 3000)
    for window in (1, 7, 100, 10_000):
        naive = [np.log(((tokens[max(0, i - window):i] == t).sum() + 1 / vocab) / (min(i, window) + 1))
                 for i, t in enumerate(tokens)]
        np.testing.assert_allclose(cache_logprobs(tokens, window, vocab), naive, rtol=1e-12)
    history = tokens[:50]  # p(w) for every w after this history: one distribution
    total = sum(np.exp(cache_logprobs(np.append(history, w), 20, vocab)[-1]) for w in range(vocab))
    assert abs(total - 1) < 1e-12


def test_a_repetitive_text_gains_from_the_cache_and_its_window_is_chosen_on_valid():
    """Tokens that recur within a stretch of text: the cache takes weight, lowers the loss below the models alone,
    and the window kept is the one with the best valid likelihood."""
    from lmpipe.combine import CACHE, cache_logprobs, combination

    rng = np.random.default_rng(5)
    vocab = 200
    stream = np.concatenate([rng.choice(rng.choice(vocab, 8), 100) for _ in range(40)])  # 8 words per stretch
    splits = {"valid": Split("valid", stream[:2000], 1000, 6000), "test": Split("test", stream[2000:], 1000, 6000)}
    uniform = {s: np.full(len(splits[s].tokens), -np.log(vocab), dtype=np.float32) for s in splits}
    rows = combinations({"ngram": uniform, "gru": uniform}, splits, cache_windows=[5, 50, 2000], vocab_size=vocab)
    cached = rows[f"gru+ngram+{CACHE}"]
    assert cached["weights"][CACHE] > 0.5 and cached["test"]["loss"] < rows["gru+ngram"]["test"]["loss"] - 1
    losses = {w: combination(["gru", "ngram", CACHE], {"gru": uniform, "ngram": uniform, CACHE: {
        s: cache_logprobs(splits[s].tokens, w, vocab) for s in splits}}, splits)["valid"]["loss"] for w in (5, 50, 2000)}
    assert cached["cache_window"] == min(losses, key=losses.get)
