"""Decoding for every model through one interface: `next_token_distribution(context) -> probabilities`.

Greedy, beam search (batched beams, length normalisation, end-of-line handling), and sampling with
temperature, top-k, top-p (nucleus) or locally typical filtering. Sampling is seeded.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Sequence

import numpy as np
import torch

from lmpipe.config import EvaluateParams, Strategy

_PARAMS = EvaluateParams()  # the defaults of params.yaml's `evaluate`: written once, in lmpipe.config


@dataclass(frozen=True)
class DecodeSettings:
    """One generation call's settings; those shared with params.yaml's `evaluate` default to its defaults."""

    strategy: Strategy = "top-p"
    max_new_tokens: int = _PARAMS.max_new_tokens
    temperature: float = _PARAMS.temperature
    top_k: int = _PARAMS.top_k
    top_p: float = _PARAMS.top_p
    typical_p: float = _PARAMS.typical_p
    beam_size: int = _PARAMS.beam_size
    length_penalty: float = 1.0  # beam: score / length**alpha
    stop_at_boundary: bool = False  # end at the boundary token (end of line)
    seed: int | tuple[int, ...] = _PARAMS.seed  # numpy seed entropy: one number, or several (seed, prompt position)

    @classmethod
    def from_params(cls, params: EvaluateParams, **changes) -> "DecodeSettings":
        """The settings `params` (an `evaluate` section) gives, with `changes` on top."""
        shared = {f.name: getattr(params, f.name) for f in fields(cls) if f.name in type(params).model_fields}
        return cls(**{**shared, **changes})


def distributions(model, contexts: Sequence[Sequence[int]]) -> np.ndarray:
    """(len(contexts), V) next-token probabilities; one batched forward where the model offers it."""
    batched = getattr(model, "next_token_distributions", None)
    if batched is not None:
        return batched(contexts)
    return np.stack([model.next_token_distribution(c) for c in contexts])


def _temper(p: np.ndarray, temperature: float) -> np.ndarray:
    if temperature == 1.0:
        return p
    logits = np.log(np.maximum(p, 1e-300)) / temperature
    q = np.exp(logits - logits.max())
    return q / q.sum()


def filter_top_k(p: np.ndarray, k: int) -> np.ndarray:
    keep = np.argsort(-p, kind="stable")[:k]
    out = np.zeros_like(p)
    out[keep] = p[keep]
    return out / out.sum()


def filter_top_p(p: np.ndarray, top_p: float) -> np.ndarray:
    """The smallest set of most likely tokens whose mass reaches top_p (always at least one token)."""
    order = np.argsort(-p, kind="stable")
    cumulative = np.cumsum(p[order])
    n = int(np.searchsorted(cumulative, top_p) + 1)
    out = np.zeros_like(p)
    out[order[:n]] = p[order[:n]]
    return out / out.sum()


def filter_typical(p: np.ndarray, mass: float) -> np.ndarray:
    """Locally typical sampling (Meister et al. 2023): tokens whose surprisal is closest to the entropy."""
    logp = np.log(np.maximum(p, 1e-300))
    entropy = -(p * logp).sum()
    order = np.argsort(np.abs(-logp - entropy), kind="stable")
    n = int(np.searchsorted(np.cumsum(p[order]), mass) + 1)
    out = np.zeros_like(p)
    out[order[:n]] = p[order[:n]]
    return out / out.sum()


def _pick(p: np.ndarray, settings: DecodeSettings, rng: np.random.Generator) -> int:
    if settings.strategy == "greedy":
        return int(np.argmax(p))
    p = _temper(p, settings.temperature)
    if settings.strategy == "top-k":
        p = filter_top_k(p, settings.top_k)
    elif settings.strategy == "top-p":
        p = filter_top_p(p, settings.top_p)
    elif settings.strategy == "typical":
        p = filter_typical(p, settings.typical_p)
    return int(rng.choice(len(p), p=p))


def generate(model, prompt: Sequence[int], settings: DecodeSettings, boundary: int) -> list[int]:
    """New token ids after `prompt` (the prompt itself is not returned)."""
    if settings.strategy == "beam":
        return beam_search(model, prompt, settings, boundary)
    rng = np.random.default_rng(settings.seed)
    context, new = list(prompt), []
    for _ in range(settings.max_new_tokens):
        token = _pick(distributions(model, [context])[0], settings, rng)
        new.append(token)
        context.append(token)
        if settings.stop_at_boundary and token == boundary:
            break
    return new


def beam_search(model, prompt: Sequence[int], settings: DecodeSettings, boundary: int) -> list[int]:
    """Beam search over log probabilities; a hypothesis that emits the boundary (with stop_at_boundary) is finished.

    All beams of a step are scored in one batched call. Finished and unfinished hypotheses compete
    by score / length**length_penalty once max_new_tokens is reached.
    """
    beams: list[tuple[float, list[int]]] = [(0.0, [])]
    finished: list[tuple[float, list[int]]] = []
    norm = lambda score, seq: score / max(len(seq), 1) ** settings.length_penalty  # noqa: E731
    for _ in range(settings.max_new_tokens):
        logp = np.log(np.maximum(distributions(model, [list(prompt) + seq for _, seq in beams]), 1e-300))
        scores = np.array([s for s, _ in beams])[:, None] + logp  # (beams, V)
        flat = np.argsort(-scores, axis=None, kind="stable")[: 2 * settings.beam_size]
        candidates = []
        for index in flat:
            b, token = divmod(int(index), logp.shape[1])
            seq = beams[b][1] + [token]
            if settings.stop_at_boundary and token == boundary:
                finished.append((float(scores[b, token]), seq))
            else:
                candidates.append((float(scores[b, token]), seq))
            if len(candidates) == settings.beam_size:
                break
        beams = candidates
        if not beams:
            break
    pool = finished + beams
    return max(pool, key=lambda item: norm(*item))[1]


def surprisals(model, prompt: Sequence[int], tokens: Sequence[int]) -> list[float]:
    """-log p of each generated token under the model that generated it (untempered, unfiltered).

    A neural model scores the whole continuation in one forward pass when it fits its window (the
    contexts are then the same as token by token); the n-gram, token by token.
    """
    if not tokens:
        return []
    window = getattr(model, "block_size", None)
    if isinstance(model, torch.nn.Module) and (window is None or len(prompt) + len(tokens) <= window):
        return _surprisals_in_one_pass(model, list(prompt), list(tokens))
    context, out = list(prompt), []
    for token in tokens:
        out.append(float(-np.log(max(distributions(model, [context])[0][token], 1e-300))))
        context.append(token)
    return out


@torch.no_grad()
def _surprisals_in_one_pass(model, prompt: list[int], tokens: list[int]) -> list[float]:
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    ids = torch.tensor([[model.boundary] + prompt + tokens[:-1]], device=device)
    logits, _ = model(ids, None)
    model.train(was_training)
    p = torch.softmax(logits[0, len(prompt):].float(), dim=-1).cpu().double().numpy()
    return [float(-np.log(max(p[i, token], 1e-300))) for i, token in enumerate(tokens)]


def diversity(samples: Sequence[Sequence[int]]) -> dict:
    """distinct-1/2 (unique n-grams over all n-grams) and repetition rate (tokens repeating the previous 4-gram window)."""
    unigrams = [t for s in samples for t in s]
    bigrams = [tuple(s[i:i + 2]) for s in samples for i in range(len(s) - 1)]
    repeats = sum(1 for s in samples for i in range(len(s)) if s[i] in s[max(0, i - 4):i])
    return {
        "distinct_1": len(set(unigrams)) / max(len(unigrams), 1),
        "distinct_2": len(set(bigrams)) / max(len(bigrams), 1),
        "repetition_rate": repeats / max(len(unigrams), 1),
    }
