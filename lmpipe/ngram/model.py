"""NGramLM: an n-gram LM over BPE token ids (interpolated modified Kneser-Ney, add-k, stupid backoff).

Sentence semantics as KenLM/SRILM have them, so the ARPA export scores the same: every line of the
stream is a sentence; the boundary token that ends a line is `</s>` when predicted and `<s>` as the
context of the next line; no n-gram reaches across it. Counting and scoring are vectorised: an
n-gram is (context key, word) with the context's tokens packed 16 bits each into a uint64 (most
recent token highest, so the n-grams of one most recent token are contiguous in sorted order: the
partitions of the out-of-core build, lmpipe.ngram_build), found by `searchsorted` in sorted key
tables — one NumPy pass per order. `NGramLM.fit` counts in memory; the ngram stage builds the same
tables within a memory bound (lmpipe.ngram_build); a saved model loads memory-mapped.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Literal, NamedTuple

import numpy as np

from lmpipe.ngram.counts import (BITS, TABLE_FIELDS, WORD_SHIFT, OrderTable, adjusted_counts, context_keys,
                                 count_ngrams, line_starts, modified_kn_discounts, order_table, pack)
from lmpipe.ngram.lookup import release_pages, search_sorted
from lmpipe.perplexity import perplexities

Method = Literal["kneser_ney", "add_k", "stupid_backoff"]
SCORE_SLICE = 1 << 16  # sorted targets scored together (a task): one stretch of every order's tables


class Lookup(NamedTuple):
    """One order's numbers for many (context, word) queries."""

    found: np.ndarray  # the context is in the table
    count: np.ndarray  # the n-gram's count (raw or continuation), 0 when unseen
    total: np.ndarray  # the context's total count, 0 when unseen
    gamma: np.ndarray  # the context's discount mass (KN), 0 when unseen


class NGramLM:
    """An n-gram LM over token ids 0..vocab_size-1 with one boundary token."""

    def __init__(self, order: int, vocab_size: int, boundary: int, method: Method = "kneser_ney",
                 k: float = 0.01, alpha: float = 0.4):
        if not 1 <= order <= 5:
            raise ValueError(f"order must be 1..5, got {order}")
        if vocab_size > 1 << BITS:
            raise ValueError(f"vocab_size {vocab_size} exceeds {1 << BITS}: ids are packed {BITS} bits each")
        self.order, self.vocab_size, self.boundary = order, vocab_size, boundary
        self.method, self.k, self.alpha = method, k, alpha
        self.tables: list[OrderTable] = []
        self.discounts = np.zeros((order, 3))
        self.total_tokens = 0

    @property
    def n_ngrams(self) -> int:
        """Stored n-grams over all orders: the model's size, its 'parameter count'."""
        return int(sum(len(t.keys) for t in self.tables))

    @property
    def normalised(self) -> bool:
        return self.method != "stupid_backoff"

    # ---------- building ----------
    def fit(self, tokens: np.ndarray) -> "NGramLM":
        """Count in memory (the reference; the ngram stage builds the same tables within a memory bound)."""
        stream = np.concatenate([[self.boundary], np.asarray(tokens, dtype=np.int64)])
        raw = count_ngrams(stream, 1, self.boundary, self.order)
        self.total_tokens = len(stream) - 1
        self.tables = []
        for k in range(1, self.order + 1):
            counts = adjusted_counts(k, self.order, self.method, self.boundary, raw[k - 1],
                                     raw[k] if k < self.order else None)
            if self.method == "kneser_ney":
                self.discounts[k - 1] = modified_kn_discounts(counts)
            discounts = self.discounts[k - 1] if self.method == "kneser_ney" else None
            self.tables.append(order_table(raw[k - 1][0], raw[k - 1][1], counts, discounts))
        return self

    # ---------- scoring ----------
    def _lookups(self, contexts_by_order: list, words: np.ndarray):
        """Each order's numbers, shortest context first. A context is searched only where the next shorter one
        is in its table: every part of a seen n-gram is seen, so the others cannot be there."""
        among = np.arange(len(words))
        for k, contexts in enumerate(contexts_by_order, 1):
            at = self._lookup(k, contexts, words, among)
            among = np.flatnonzero(at.found)
            yield k, at

    def _lookup(self, k: int, contexts: np.ndarray, words: np.ndarray, among: np.ndarray) -> "Lookup":
        """Order k's numbers for the (context, word) queries `among`; the memory-mapped pages read are then
        released, so scoring a model larger than memory holds one stretch of one order's tables per thread."""
        table = self.tables[k - 1]
        lookup = Lookup(np.zeros(len(words), dtype=bool), *(np.zeros(len(words)) for _ in range(3)))
        asked = contexts[among]
        ci = search_sorted(table.contexts, asked)
        hit = table.contexts[ci] == asked
        seen, ci = among[hit], ci[hit]  # only under a seen context are its n-grams looked up
        keys = (ci.astype(np.uint64) << WORD_SHIFT) | words[seen].astype(np.uint64)
        ni = search_sorted(table.keys, keys)
        lookup.found[seen] = True
        lookup.count[seen] = np.where(table.keys[ni] == keys, table.counts[ni], 0.0)
        lookup.total[seen], lookup.gamma[seen] = table.context_total[ci], table.context_gamma[ci]
        for names, at in ((("contexts", "context_total", "context_gamma"), ci), (("keys", "counts"), ni)):
            for name in names:
                release_pages(getattr(table, name), at)
        return lookup

    def _discount(self, k: int, count: np.ndarray) -> np.ndarray:
        d = np.concatenate([[0.0], self.discounts[k - 1]])
        return d[np.minimum(count, 3).astype(np.int64)]

    def _probabilities(self, contexts_by_order: list, available: np.ndarray, words: np.ndarray) -> np.ndarray:
        """P(word | context) for many (context, word) pairs at once; one loop over orders, none over tokens."""
        n, lookups = len(words), self._lookups(contexts_by_order, words)
        if self.method == "kneser_ney":
            p = np.full(n, 1.0 / self.vocab_size)
            for k, at in lookups:
                usable = available >= k - 1
                interpolated = ((np.maximum(at.count - self._discount(k, at.count), 0.0) + at.gamma * p)
                                / np.where(at.found, at.total, 1))
                p = np.where(usable & at.found, interpolated, p)
            return p
        top = np.minimum(available, self.order - 1) + 1
        if self.method == "add_k":
            p = np.full(n, 1.0 / self.vocab_size)
            for k, at in lookups:
                smoothed = (at.count + self.k) / (at.total + self.k * self.vocab_size)
                p = np.where(top == k, np.where(at.found, smoothed, 1.0 / self.vocab_size), p)
            return p
        # stupid backoff (Brants et al. 2007): relative frequency at the longest order seen, alpha per step down
        _, at = next(lookups)
        unigram = (at.count + 1.0) / (self.tables[0].context_total[0] + self.vocab_size)  # add-one: never zero
        best, best_order = unigram, np.ones(n, dtype=np.int64)
        for k, at in lookups:
            seen = (top >= k) & (at.count > 0)
            best = np.where(seen, at.count / np.where(at.found, at.total, 1), best)
            best_order = np.where(seen, k, best_order)
        return best * self.alpha ** (top - best_order)

    def token_log_probs(self, tokens: np.ndarray, workers: int | None = None) -> np.ndarray:
        """Natural-log probability of every token of a stream, conditioned on one boundary before the first.

        The targets are visited sorted by their longest context: with the most recent token highest, every
        shorter context (the longest shifted right) is then sorted too, so each slice of SCORE_SLICE sorted
        targets reads one stretch of every order's tables, front to back. Slices run on `workers` threads
        (default: the cores); NumPy's searches release the GIL. The result does not depend on either."""
        stream = np.concatenate([[self.boundary], np.asarray(tokens, dtype=np.int64)])
        targets = np.arange(1, len(stream))
        available = targets - line_starts(stream, self.boundary)[targets]
        longest = self.order - 1  # positions before the stream read as token 0: `available` masks them
        keys = context_keys(np.concatenate([np.zeros(longest, dtype=np.int64), stream]), targets + longest, longest)
        visit = np.argsort(keys)
        keys, available, words = keys[visit], available[visit], stream[1:][visit].astype(np.uint64)

        def score(part: slice) -> np.ndarray:
            contexts = [keys[part] >> np.uint64(BITS * (longest - k + 1)) if k > 1 else np.zeros_like(keys[part])
                        for k in range(1, self.order + 1)]
            return self._probabilities(contexts, available[part], words[part])

        parts = [slice(start, start + SCORE_SLICE) for start in range(0, len(keys), SCORE_SLICE)]
        with ThreadPoolExecutor(workers or os.cpu_count()) as pool:
            p = np.concatenate([np.zeros(0), *pool.map(score, parts)])
        log_p = np.empty(len(p))
        log_p[visit] = np.log(p)
        return log_p

    def next_token_distribution(self, context) -> np.ndarray:
        """P(w | context) over the whole vocabulary (the decoding interface shared with the neural models)."""
        context = [int(t) for t in context]
        if self.boundary in context:  # only the current line counts, from its <s>
            context = context[len(context) - 1 - context[::-1].index(self.boundary):]
        else:  # a stream starts after an implicit boundary
            context = [self.boundary] + context
        context = context[max(0, len(context) - (self.order - 1)):] if self.order > 1 else []
        contexts = [np.full(self.vocab_size, pack(context[max(0, len(context) - (k - 1)):] if k > 1 else []),
                            dtype=np.uint64) for k in range(1, self.order + 1)]
        available = np.full(self.vocab_size, len(context))
        p = self._probabilities(contexts, available, np.arange(self.vocab_size, dtype=np.uint64))
        return p if self.normalised else p / p.sum()

    # ---------- persistence ----------
    def meta(self) -> dict:
        return {"order": self.order, "vocab_size": self.vocab_size, "boundary": self.boundary,
                "method": self.method, "k": self.k, "alpha": self.alpha, "total_tokens": self.total_tokens}

    def save(self, directory: str | Path) -> None:
        """One .npy per array, so that `load` can memory-map them."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        for k, table in enumerate(self.tables, 1):
            for name in TABLE_FIELDS:
                np.save(directory / f"{name}_{k}.npy", getattr(table, name))
        np.save(directory / "discounts.npy", self.discounts)
        (directory / "ngram.json").write_text(json.dumps(self.meta(), indent=2))

    @classmethod
    def load(cls, directory: str | Path) -> "NGramLM":
        """Tables memory-mapped: a model larger than memory scores at once, touching only what it reads."""
        directory = Path(directory)
        meta = json.loads((directory / "ngram.json").read_text())
        total = meta.pop("total_tokens")
        model = cls(**meta)
        model.total_tokens = total
        model.discounts = np.load(directory / "discounts.npy")
        model.tables = [OrderTable(*(np.load(directory / f"{name}_{k}.npy", mmap_mode="r") for name in TABLE_FIELDS))
                        for k in range(1, model.order + 1)]
        return model


def perplexity(log_probs: np.ndarray, words: int, n_bytes: int) -> dict:
    """The study's perplexities from per-token natural-log probabilities."""
    return perplexities(-float(np.sum(log_probs)), len(log_probs), words, n_bytes)
