"""Linear interpolation of language models: p(t) = sum_i w_i p_i(t), per token, with the weights fitted on valid.

Every model of the study scores the same BPE token stream, so mixing their per-token probabilities is exact
(Mikolov et al. 2011 interpolate an RNNLM with KN-5 the same way). The weights maximise the valid likelihood by EM
(each step re-weights a model by the share of the probability it contributed, which never lowers the likelihood);
the test split is scored once, with those weights. The mixture is computed in log space, so a weight of 1 on one
model gives back that model's log-probabilities exactly.
"""

from __future__ import annotations

import itertools
from typing import Mapping

import numpy as np
from scipy.special import logsumexp

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


def combinations(logprobs: Mapping[str, Mapping[str, np.ndarray]], splits, baseline: str = "ngram") -> dict:
    """{name: row}: each neural model with the baseline, the best pair of neural models (by valid loss), and all
    models together. Names join the models with '+' (e.g. gru+ngram)."""
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
    return rows
