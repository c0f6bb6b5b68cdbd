"""N-gram language model over BPE token ids: interpolated modified Kneser-Ney, add-k, stupid backoff.

Sentence semantics as KenLM/SRILM have them, so the ARPA export scores the same: every line of the
stream is a sentence; the boundary token that ends a line is `</s>` when predicted and `<s>` as the
context of the next line; no n-gram reaches across it. Counting and scoring are vectorised: an
n-gram is (context key, word) with the context's tokens packed 16 bits each into a uint64 (most
recent token lowest), found by `searchsorted` in sorted key tables — one NumPy pass per order.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from lmpipe.perplexity import perplexities

BITS = 16
WORD_SHIFT = np.uint64(32)
Method = Literal["kneser_ney", "add_k", "stupid_backoff"]


@dataclass
class OrderTable:
    """Everything one order needs for lookups, all arrays sorted for `searchsorted`."""

    contexts: np.ndarray  # uint64, sorted unique context keys
    context_total: np.ndarray  # float64, sum of counts over the context's words (A(h) or c(h))
    context_gamma: np.ndarray  # float64, D1*N1 + D2*N2 + D3*N3+ of the context (numerator of gamma)
    keys: np.ndarray  # uint64, sorted (context index << 32 | word)
    counts: np.ndarray  # float64, the count of each n-gram used at this order (raw or continuation)


def line_starts(stream: np.ndarray, boundary: int) -> np.ndarray:
    """For each position of the boundary-prefixed stream, the index of its line's `<s>` (the boundary before it)."""
    is_boundary = stream == boundary
    index = np.where(is_boundary, np.arange(len(stream)), 0)
    starts = np.maximum.accumulate(index)
    # a position that is itself a boundary is predicted within the line it ends
    previous = np.concatenate([[0], starts[:-1]])
    return np.where(is_boundary, previous, starts)


def _context_keys(stream: np.ndarray, targets: np.ndarray, length: int) -> np.ndarray:
    key = np.zeros(len(targets), dtype=np.uint64)
    for j in range(1, length + 1):
        key |= stream[targets - j].astype(np.uint64) << np.uint64(BITS * (j - 1))
    return key


def _unique_ngrams(contexts: np.ndarray, words: np.ndarray):
    """Sorted unique (context, word) pairs with their counts."""
    order = np.lexsort((words, contexts))
    c, w = contexts[order], words[order]
    new = np.ones(len(c), dtype=bool)
    new[1:] = (c[1:] != c[:-1]) | (w[1:] != w[:-1])
    starts = np.flatnonzero(new)
    counts = np.diff(np.append(starts, len(c)))
    return c[starts], w[starts], counts


def modified_kn_discounts(counts: np.ndarray) -> np.ndarray:
    """D1, D2, D3+ of Chen & Goodman (1998) from counts-of-counts, clamped so that D_j <= j."""
    n = [np.count_nonzero(counts == j) for j in (1, 2, 3, 4)]
    if n[0] == 0 or n[1] == 0:
        return np.array([0.5, 1.0, 1.5])  # degenerate tiny corpora: a safe, valid choice
    y = n[0] / (n[0] + 2 * n[1])
    raw = [j - (j + 1) * y * (n[j] / n[j - 1] if n[j - 1] else 0.0) for j in (1, 2, 3)]
    return np.array([min(max(d, 0.0), float(j)) for j, d in zip((1, 2, 3), raw)])


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
        stream = np.concatenate([[self.boundary], np.asarray(tokens, dtype=np.int64)])
        targets = np.arange(1, len(stream))
        available = targets - line_starts(stream, self.boundary)[targets]  # context tokens within the line
        self.total_tokens = len(targets)
        raw = []
        for k in range(1, self.order + 1):
            at = targets[available >= k - 1]
            raw.append(_unique_ngrams(_context_keys(stream, at, k - 1), stream[at].astype(np.uint64)))
        self.tables = [self._table(k, raw) for k in range(1, self.order + 1)]
        return self

    def _adjusted(self, k: int, raw: list):
        """Counts used at order k: raw at the top order and for n-grams starting with <s>; else continuation counts."""
        contexts, words, counts = raw[k - 1]
        if self.method != "kneser_ney" or k == self.order:
            return contexts, words, counts.astype(np.float64)
        up_contexts, up_words, _ = raw[k]
        mask = np.uint64((1 << (BITS * (k - 1))) - 1)
        suffix_c, suffix_w, extensions = _unique_ngrams(up_contexts & mask, up_words)
        position, found = _find_pairs(suffix_c, suffix_w, contexts, words)
        adjusted = np.where(found, extensions[position], 0).astype(np.float64)
        if k >= 2:
            oldest = (contexts >> np.uint64(BITS * (k - 2))) & np.uint64((1 << BITS) - 1)
            starts_line = oldest == np.uint64(self.boundary)
            adjusted = np.where(starts_line, counts, adjusted)
        return contexts, words, adjusted

    def _table(self, k: int, raw: list) -> OrderTable:
        contexts, words, counts = self._adjusted(k, raw)
        new = np.ones(len(contexts), dtype=bool)
        new[1:] = contexts[1:] != contexts[:-1]
        first = np.flatnonzero(new)
        unique_contexts = contexts[first]
        context_index = np.cumsum(new) - 1
        totals = np.add.reduceat(counts, first)
        gamma = np.zeros(len(first))
        if self.method == "kneser_ney":
            d = modified_kn_discounts(counts)
            self.discounts[k - 1] = d
            bucket = np.minimum(counts, 3).astype(np.int64) - 1
            gamma = np.add.reduceat(d[bucket], first)
        keys = (context_index.astype(np.uint64) << WORD_SHIFT) | words
        return OrderTable(unique_contexts, totals, gamma, keys, counts)

    # ---------- scoring ----------
    def _lookup(self, k: int, contexts: np.ndarray, words: np.ndarray):
        """(context seen?, context index, count of context+word) for many pairs at once."""
        table = self.tables[k - 1]
        ci = np.minimum(np.searchsorted(table.contexts, contexts), len(table.contexts) - 1)
        context_found = table.contexts[ci] == contexts
        keys = (ci.astype(np.uint64) << WORD_SHIFT) | words.astype(np.uint64)
        ni = np.minimum(np.searchsorted(table.keys, keys), len(table.keys) - 1)
        count = np.where(context_found & (table.keys[ni] == keys), table.counts[ni], 0.0)
        return context_found, ci, count

    def _discount(self, k: int, count: np.ndarray) -> np.ndarray:
        d = np.concatenate([[0.0], self.discounts[k - 1]])
        return d[np.minimum(count, 3).astype(np.int64)]

    def _probabilities(self, contexts_by_order: list, available: np.ndarray, words: np.ndarray) -> np.ndarray:
        """P(word | context) for many (context, word) pairs at once; one loop over orders, none over tokens."""
        n = len(words)
        if self.method == "kneser_ney":
            p = np.full(n, 1.0 / self.vocab_size)
            for k in range(1, self.order + 1):
                usable = available >= k - 1
                found, ci, count = self._lookup(k, contexts_by_order[k - 1], words)
                table = self.tables[k - 1]
                total, gamma = table.context_total[ci], table.context_gamma[ci]
                interpolated = (np.maximum(count - self._discount(k, count), 0.0) + gamma * p) / np.where(found, total, 1)
                p = np.where(usable & found, interpolated, p)
            return p
        top = np.minimum(available, self.order - 1) + 1
        if self.method == "add_k":
            p = np.full(n, 1.0 / self.vocab_size)
            for k in range(1, self.order + 1):
                found, ci, count = self._lookup(k, contexts_by_order[k - 1], words)
                total = self.tables[k - 1].context_total[ci]
                smoothed = (count + self.k) / (np.where(found, total, 0) + self.k * self.vocab_size)
                p = np.where(top == k, np.where(found, smoothed, 1.0 / self.vocab_size), p)
            return p
        # stupid backoff (Brants et al. 2007): relative frequency at the longest order seen, alpha per step down
        _, _, count1 = self._lookup(1, contexts_by_order[0], words)
        unigram = (count1 + 1.0) / (self.tables[0].context_total[0] + self.vocab_size)  # add-one: never zero
        best, best_order = unigram, np.ones(n, dtype=np.int64)
        for k in range(2, self.order + 1):
            found, ci, count = self._lookup(k, contexts_by_order[k - 1], words)
            seen = (top >= k) & (count > 0)
            best = np.where(seen, count / np.where(found, self.tables[k - 1].context_total[ci], 1), best)
            best_order = np.where(seen, k, best_order)
        return best * self.alpha ** (top - best_order)

    def token_log_probs(self, tokens: np.ndarray) -> np.ndarray:
        """Natural-log probability of every token of a stream, conditioned on one boundary before the first."""
        stream = np.concatenate([[self.boundary], np.asarray(tokens, dtype=np.int64)])
        targets = np.arange(1, len(stream))
        available = targets - line_starts(stream, self.boundary)[targets]
        # contexts longer than a target's line are masked out by `available` later
        contexts = [_context_keys(stream, np.maximum(targets, k - 1), k - 1) for k in range(1, self.order + 1)]
        return np.log(self._probabilities(contexts, available, stream[targets].astype(np.uint64)))

    def next_token_distribution(self, context) -> np.ndarray:
        """P(w | context) over the whole vocabulary (the decoding interface shared with the neural models)."""
        context = [int(t) for t in context]
        if self.boundary in context:  # only the current line counts, from its <s>
            context = context[len(context) - 1 - context[::-1].index(self.boundary):]
        else:  # a stream starts after an implicit boundary
            context = [self.boundary] + context
        context = context[max(0, len(context) - (self.order - 1)):] if self.order > 1 else []
        contexts = [np.full(self.vocab_size, _pack(context[max(0, len(context) - (k - 1)):] if k > 1 else []),
                            dtype=np.uint64) for k in range(1, self.order + 1)]
        available = np.full(self.vocab_size, len(context))
        p = self._probabilities(contexts, available, np.arange(self.vocab_size, dtype=np.uint64))
        return p if self.normalised else p / p.sum()

    # ---------- persistence ----------
    def save(self, directory: str | Path) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        arrays = {}
        for k, t in enumerate(self.tables, 1):
            for name in ("contexts", "context_total", "context_gamma", "keys", "counts"):
                arrays[f"{name}_{k}"] = getattr(t, name)
        np.savez_compressed(directory / "ngram.npz", discounts=self.discounts, **arrays)
        (directory / "ngram.json").write_text(json.dumps({
            "order": self.order, "vocab_size": self.vocab_size, "boundary": self.boundary,
            "method": self.method, "k": self.k, "alpha": self.alpha, "total_tokens": self.total_tokens,
        }, indent=2))

    @classmethod
    def load(cls, directory: str | Path) -> "NGramLM":
        directory = Path(directory)
        meta = json.loads((directory / "ngram.json").read_text())
        total = meta.pop("total_tokens")
        model = cls(**meta)
        model.total_tokens = total
        with np.load(directory / "ngram.npz") as data:
            model.discounts = data["discounts"]
            model.tables = [OrderTable(*(data[f"{name}_{k}"] for name in
                                         ("contexts", "context_total", "context_gamma", "keys", "counts")))
                            for k in range(1, model.order + 1)]
        return model


def _find_pairs(table_c: np.ndarray, table_w: np.ndarray, query_c: np.ndarray, query_w: np.ndarray):
    """Index of each query (context, word) pair in a table sorted by (context, word), and whether it is there."""
    all_contexts = np.unique(np.concatenate([table_c, query_c]))
    table_keys = (np.searchsorted(all_contexts, table_c).astype(np.uint64) << WORD_SHIFT) | table_w
    query_keys = (np.searchsorted(all_contexts, query_c).astype(np.uint64) << WORD_SHIFT) | query_w
    position = np.minimum(np.searchsorted(table_keys, query_keys), len(table_keys) - 1)
    return position, table_keys[position] == query_keys


def _pack(tokens: list[int]) -> int:
    """Context key of a token list: most recent token in the lowest 16 bits."""
    key = 0
    for j, token in enumerate(reversed(tokens)):
        key |= token << (BITS * j)
    return key


def perplexity(log_probs: np.ndarray, words: int, n_bytes: int) -> dict:
    """The study's perplexities from per-token natural-log probabilities."""
    return perplexities(-float(np.sum(log_probs)), len(log_probs), words, n_bytes)


def _tokens_of(contexts: np.ndarray, words: np.ndarray, k: int) -> np.ndarray:
    """(n, k) token matrix of order-k n-grams, oldest token first."""
    columns = [(contexts >> np.uint64(BITS * (j - 1))) & np.uint64((1 << BITS) - 1) for j in range(k - 1, 0, -1)]
    return np.stack(columns + [words], axis=1).astype(np.int64)


def write_arpa(model: NGramLM, path: str | Path) -> dict:
    """Export an interpolated Kneser-Ney model in ARPA backoff form (KenLM, SRILM).

    Tokens are written as their ids; the boundary is `</s>` when predicted and `<s>` as context.
    Each listed n-gram carries its full interpolated log10 probability, each context its backoff
    log10(gamma), so backoff arithmetic reproduces the interpolated model exactly.
    """
    if model.method != "kneser_ney":
        raise ValueError(f"ARPA export needs a backoff-form model (kneser_ney), not {model.method}")
    names = np.array([str(i) for i in range(model.vocab_size)], dtype=object)
    names[model.boundary] = "</s>"
    sections, counts = [], {}
    for k in range(1, model.order + 1):
        table = model.tables[k - 1]
        if k == 1:
            words = np.arange(model.vocab_size, dtype=np.uint64)
            contexts = np.zeros(model.vocab_size, dtype=np.uint64)
        else:
            context_index = (table.keys >> WORD_SHIFT).astype(np.int64)
            contexts, words = table.contexts[context_index], table.keys & np.uint64(0xFFFFFFFF)
        by_order = [contexts & np.uint64((1 << (BITS * (j - 1))) - 1) for j in range(1, model.order + 1)]
        prob = model._probabilities(by_order, np.full(len(words), k - 1), words)
        tokens = _tokens_of(contexts, words, k)
        # backoff weight of each n-gram as a context one order up: gamma numerator / total
        backoff = np.full(len(words), np.nan)
        if k < model.order:
            upper = model.tables[k]
            key = np.zeros(len(words), dtype=np.uint64)
            for j in range(k):
                key |= tokens[:, k - 1 - j].astype(np.uint64) << np.uint64(BITS * j)
            ci = np.minimum(np.searchsorted(upper.contexts, key), len(upper.contexts) - 1)
            seen = upper.contexts[ci] == key
            backoff = np.where(seen, upper.context_gamma[ci] / np.where(seen, upper.context_total[ci], 1), np.nan)
        rows = []
        for p, row, b in zip(np.log10(prob), tokens, backoff):
            text = " ".join("<s>" if (j == 0 and k > 1 and t == model.boundary) else names[t]
                            for j, t in enumerate(row))
            rows.append(f"{p:.7f}\t{text}" + ("" if np.isnan(b) else f"\t{np.log10(b) if b > 0 else -99:.7f}"))
        if k == 1:
            start = model.tables[1] if model.order > 1 else None
            bos_backoff = ""
            if start is not None:
                key = np.uint64(model.boundary)
                ci = int(np.searchsorted(start.contexts, key))
                if ci < len(start.contexts) and start.contexts[ci] == key:
                    bos_backoff = f"\t{np.log10(start.context_gamma[ci] / start.context_total[ci]):.7f}"
            rows += [f"-99\t<s>{bos_backoff}", "-99\t<unk>"]
        counts[k] = len(rows)
        sections.append(f"\\{k}-grams:\n" + "\n".join(rows) + "\n")
    header = "\\data\\\n" + "".join(f"ngram {k}={n}\n" for k, n in counts.items())
    Path(path).write_text(header + "\n" + "\n".join(sections) + "\n\\end\\\n", encoding="utf-8")
    return counts
