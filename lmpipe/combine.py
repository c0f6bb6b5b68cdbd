"""Linear interpolation of language models: p(t) = sum_i w_i p_i(t), per token, with the weights fitted on valid.

Every model of the study scores the same BPE token stream, so mixing their per-token probabilities is exact
(Mikolov et al. 2011 interpolate an RNNLM with KN-5 the same way). The weights maximise the valid likelihood by EM
(each step re-weights a model by the share of the probability it contributed, which never lowers the likelihood);
the test split is scored once, with those weights. The mixture is computed in log space, so a weight of 1 on one
model gives back that model's log-probabilities exactly.

One more component joins the combination of all models: a unigram cache (Kuhn & De Mori 1990), the share of each
token among the W tokens before it in the same split, with one pseudo-count spread over the vocabulary so that
every token has a probability. It has no parameters to train and reads only the text already scored; W is chosen,
like the weights, by the valid likelihood. It captures what a fixed context window forgets: a rare name or term
recurring within an article.
"""

from __future__ import annotations

import itertools
from typing import Mapping

import numpy as np
from scipy.special import logsumexp

from lmpipe.compare import CACHE
from lmpipe.paths import BASELINE
from lmpipe.perplexity import perplexities


def mixture_logprobs(logprobs: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """log sum_i w_i p_i(t) for each token t, from the models' log-probabilities (models x tokens)."""
    with np.errstate(divide="ignore"):  # a weight of 0 is log 0 = -inf: that model drops out exactly
        return logsumexp(np.asarray(logprobs, dtype=np.float64) + np.log(weights)[:, None], axis=0)


def fit_weights(logprobs: np.ndarray, iterations: int = 1000, tolerance: float = 1e-10) -> np.ndarray:
    """The interpolation weights that maximise the mean log-probability of these tokens (EM from uniform)."""
    logprobs = np.asarray(logprobs, dtype=np.float64)
    weights = np.full(len(logprobs), 1 / len(logprobs))
    for _ in range(iterations):
        with np.errstate(divide="ignore"):
            shares = np.exp(logprobs + np.log(weights)[:, None] - mixture_logprobs(logprobs, weights))
        updated = shares.mean(axis=1)
        updated /= updated.sum()
        done = np.max(np.abs(updated - weights)) < tolerance
        weights = updated
        if done:
            break
    return weights


def score(logprobs: np.ndarray, split) -> dict:
    """Perplexities of per-token log-probabilities, with the study's one accounting (lmpipe.perplexity)."""
    return perplexities(-float(np.sum(logprobs, dtype=np.float64)), len(logprobs), split.words, split.bytes)


def combination(names: list[str], logprobs: Mapping[str, Mapping[str, np.ndarray]], splits) -> dict:
    """One combined model: weights fitted on valid, then valid and test scored with them."""
    weights = fit_weights(np.stack([logprobs[n]["valid"] for n in names]))
    row = {"weights": {n: float(w) for n, w in zip(names, weights)}}
    for split in ("valid", "test"):
        mixed = mixture_logprobs(np.stack([logprobs[n][split] for n in names]), weights)
        row[split] = score(mixed, splits[split])
    return row


def cache_logprobs(tokens: np.ndarray, window: int, vocab_size: int) -> np.ndarray:
    """log p_cache(t_i) = log((c_i + 1/V) / (n_i + 1)) for each token: c_i is how often t_i occurs among the n_i =
    min(i, window) tokens before it. Vectorised: with the positions sorted by (token, position), the occurrences
    before i are i's rank in its token's group, and those that left the window are found by searchsorted."""
    tokens = np.asarray(tokens, dtype=np.int64)
    n = len(tokens)
    order = np.lexsort((np.arange(n), tokens))  # by token, then position
    token, position = tokens[order], order
    group_start = np.searchsorted(token, token, side="left")
    before = np.arange(n) - group_start  # earlier occurrences of the same token
    stride = n + window + 1  # one key per (token, position + window): sorted like `order`
    keys = token * stride + position + window
    left_window = np.searchsorted(keys, token * stride + position, side="left") - group_start  # p + window < i
    counts = np.empty(n)
    counts[order] = before - left_window
    history = np.minimum(np.arange(n), window)
    return np.log((counts + 1 / vocab_size) / (history + 1))


def with_cache(names: list[str], logprobs: Mapping[str, Mapping[str, np.ndarray]], splits, windows: list[int],
               vocab_size: int) -> dict:
    """The combination of `names` and a unigram cache, its window the best on valid among `windows`."""
    best = None
    for window in windows:
        cache = {s: cache_logprobs(splits[s].tokens, window, vocab_size) for s in ("valid", "test")}
        row = combination([*names, CACHE], {**logprobs, CACHE: cache}, splits)
        if best is None or row["valid"]["loss"] < best["valid"]["loss"]:
            best = {**row, "cache_window": window}
    return best


def combinations(logprobs: Mapping[str, Mapping[str, np.ndarray]], splits, baseline: str = BASELINE,
                 cache_windows: list[int] = (), vocab_size: int | None = None) -> dict:
    """{name: row}: each neural model with the baseline, the best pair of neural models (by valid loss), all models
    together, and (given `cache_windows`) all models with a unigram cache. Names join the models with '+' (e.g.
    gru+ngram)."""
    neural = sorted(n for n in logprobs if n != baseline)
    rows = {}
    if baseline in logprobs:
        rows |= {f"{n}+{baseline}": combination([n, baseline], logprobs, splits) for n in neural}
    pairs = {"+".join(pair): combination(list(pair), logprobs, splits) for pair in itertools.combinations(neural, 2)}
    if pairs:
        best = min(pairs, key=lambda name: pairs[name]["valid"]["loss"])
        rows[best] = pairs[best]
    if len(logprobs) > 2:
        everything = sorted(logprobs)
        rows["+".join(everything)] = combination(everything, logprobs, splits)
    if cache_windows and logprobs:
        rows["+".join([*sorted(logprobs), CACHE])] = with_cache(sorted(logprobs), logprobs, splits, list(cache_windows),
                                                                vocab_size)
    return rows
