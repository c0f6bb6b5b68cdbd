"""N-gram language model over BPE token ids: interpolated modified Kneser-Ney, add-k, stupid backoff.

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
import mmap
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Literal, NamedTuple

import numpy as np

from lmpipe.perplexity import perplexities

BITS = 16
TOKEN_MASK = np.uint64((1 << BITS) - 1)
WORD_BITS = np.uint64(BITS)
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


TABLE_FIELDS = tuple(f.name for f in fields(OrderTable))


class Lookup(NamedTuple):
    """One order's numbers for many (context, word) queries."""

    found: np.ndarray  # the context is in the table
    count: np.ndarray  # the n-gram's count (raw or continuation), 0 when unseen
    total: np.ndarray  # the context's total count, 0 when unseen
    gamma: np.ndarray  # the context's discount mass (KN), 0 when unseen


def line_starts(stream: np.ndarray, boundary: int) -> np.ndarray:
    """For each position of the boundary-prefixed stream, the index of its line's `<s>` (the boundary before it)."""
    is_boundary = stream == boundary
    index = np.where(is_boundary, np.arange(len(stream)), 0)
    starts = np.maximum.accumulate(index)
    # a position that is itself a boundary is predicted within the line it ends
    previous = np.concatenate([[0], starts[:-1]])
    return np.where(is_boundary, previous, starts)


def context_keys(stream: np.ndarray, targets: np.ndarray, length: int) -> np.ndarray:
    """Packed keys of the `length` tokens before each target: the most recent highest, the oldest lowest."""
    key = np.zeros(len(targets), dtype=np.uint64)
    for j in range(1, length + 1):
        key |= stream[targets - j].astype(np.uint64) << np.uint64(BITS * (length - j))
    return key


def count_ngrams(stream: np.ndarray, first: int, boundary: int, order: int) -> list:
    """Sorted unique n-grams (contexts, words, counts) of orders 1..order over the targets stream[first:].

    `stream[:first]` supplies context only; a stream that does not start with a boundary is taken to
    start a line at its first position, which is exact when `first` >= the longest context (order - 1).
    """
    stream = np.asarray(stream, dtype=np.int64)
    targets = np.arange(first, len(stream))
    available = targets - line_starts(stream, boundary)[targets]  # context tokens within the line
    raw = []
    for k in range(1, order + 1):
        at = targets[available >= k - 1]
        raw.append(unique_ngrams(context_keys(stream, at, k - 1), stream[at].astype(np.uint64)))
    return raw


def unique_ngrams(contexts: np.ndarray, words: np.ndarray, counts: np.ndarray | None = None):
    """Sorted unique (context, word) pairs with their counts (the sum of `counts`, or of ones when None)."""
    if _fits_one_key(contexts):  # up to 3 context tokens: one uint64 key, one plain sort (~3x faster than lexsort)
        keys = (contexts << WORD_BITS) | words
        order = None if counts is None else np.argsort(keys)
        keys = np.sort(keys) if order is None else keys[order]
        new = np.ones(len(keys), dtype=bool)
        new[1:] = keys[1:] != keys[:-1]
        starts = np.flatnonzero(new)
        c, w = keys[starts] >> WORD_BITS, keys[starts] & TOKEN_MASK
    else:
        order = np.lexsort((words, contexts))
        c, w = contexts[order], words[order]
        new = np.ones(len(c), dtype=bool)
        new[1:] = (c[1:] != c[:-1]) | (w[1:] != w[:-1])
        starts = np.flatnonzero(new)
        c, w = c[starts], w[starts]
    if counts is None:
        summed = np.diff(np.append(starts, len(new)))
    else:
        summed = np.add.reduceat(counts[order], starts) if len(starts) else counts[:0]
    return c, w, summed


def _fits_one_key(contexts: np.ndarray) -> bool:
    return len(contexts) == 0 or int(contexts.max()) < (1 << (64 - BITS))


def counts_of_counts(counts: np.ndarray) -> np.ndarray:
    """How many n-grams have count 1, 2, 3 and 4: all the discounts need, summable over partitions."""
    return np.array([np.count_nonzero(counts == j) for j in (1, 2, 3, 4)], dtype=np.int64)


def adjusted_counts(k: int, order: int, method: str, boundary: int, raw, raw_up) -> np.ndarray:
    """Counts used at order k: raw at the top order and for n-grams starting with <s>; else continuation counts.

    The continuation count of (context, word) is the number of distinct tokens seen before it: the order-(k+1)
    n-grams `raw_up` whose context without its oldest token (key >> 16) is `context`.
    """
    contexts, words, counts = raw
    if method != "kneser_ney" or k == order:
        return counts.astype(np.float64)
    up_contexts, up_words, _ = raw_up
    suffix_c, suffix_w, extensions = unique_ngrams(up_contexts >> np.uint64(BITS), up_words)
    position, found = _find_pairs(suffix_c, suffix_w, contexts, words)
    adjusted = np.zeros(len(contexts))
    adjusted[found] = extensions[position[found]]
    if k >= 2:  # the oldest token sits in the lowest 16 bits
        adjusted = np.where((contexts & TOKEN_MASK) == np.uint64(boundary), counts, adjusted)
    return adjusted


def modified_kn_discounts(counts: np.ndarray | None = None, n: np.ndarray | None = None) -> np.ndarray:
    """D1, D2, D3+ of Chen & Goodman (1998) from counts-of-counts, clamped so that D_j <= j."""
    n = counts_of_counts(counts) if n is None else n
    if n[0] == 0 or n[1] == 0:
        return np.array([0.5, 1.0, 1.5])  # degenerate tiny corpora: a safe, valid choice
    y = n[0] / (n[0] + 2 * n[1])
    raw = [j - (j + 1) * y * (n[j] / n[j - 1] if n[j - 1] else 0.0) for j in (1, 2, 3)]
    return np.array([min(max(d, 0.0), float(j)) for j, d in zip((1, 2, 3), raw)])


def order_table(contexts: np.ndarray, words: np.ndarray, counts: np.ndarray, discounts: np.ndarray | None,
                first_context: int = 0) -> OrderTable:
    """The lookup table of n-grams sorted by (context, word); context indices in keys start at `first_context`.

    A partition's table built alone equals its rows of the whole table: every sum runs within one context.
    """
    new = np.ones(len(contexts), dtype=bool)
    new[1:] = contexts[1:] != contexts[:-1]
    first = np.flatnonzero(new)
    context_index = np.cumsum(new) - 1 + first_context
    totals = np.add.reduceat(counts, first) if len(first) else np.zeros(0)
    gamma = np.zeros(len(first))
    if discounts is not None and len(first):
        bucket = np.minimum(counts, 3).astype(np.int64) - 1
        gamma = np.add.reduceat(discounts[bucket], first)
    keys = (context_index.astype(np.uint64) << WORD_SHIFT) | words
    return OrderTable(contexts[first], totals, gamma, keys, counts)


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
        ci = _search(table.contexts, asked)
        hit = table.contexts[ci] == asked
        seen, ci = among[hit], ci[hit]  # only under a seen context are its n-grams looked up
        keys = (ci.astype(np.uint64) << WORD_SHIFT) | words[seen].astype(np.uint64)
        ni = _search(table.keys, keys)
        lookup.found[seen] = True
        lookup.count[seen] = np.where(table.keys[ni] == keys, table.counts[ni], 0.0)
        lookup.total[seen], lookup.gamma[seen] = table.context_total[ci], table.context_gamma[ci]
        for names, at in ((("contexts", "context_total", "context_gamma"), ci), (("keys", "counts"), ni)):
            for name in names:
                _release(getattr(table, name), at)
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
        contexts = [np.full(self.vocab_size, _pack(context[max(0, len(context) - (k - 1)):] if k > 1 else []),
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


def _find_pairs(table_c: np.ndarray, table_w: np.ndarray, query_c: np.ndarray, query_w: np.ndarray):
    """Index of each query (context, word) pair in a table sorted by (context, word), and whether it is there."""
    if len(table_c) == 0:  # a partition can hold order-k n-grams none of which is extended at order k + 1
        return np.zeros(len(query_c), dtype=np.int64), np.zeros(len(query_c), dtype=bool)
    if _fits_one_key(table_c) and _fits_one_key(query_c):
        table_keys, query_keys = (table_c << WORD_BITS) | table_w, (query_c << WORD_BITS) | query_w
    else:
        all_contexts = np.unique(np.concatenate([table_c, query_c]))
        table_keys = (np.searchsorted(all_contexts, table_c).astype(np.uint64) << WORD_SHIFT) | table_w
        query_keys = (np.searchsorted(all_contexts, query_c).astype(np.uint64) << WORD_SHIFT) | query_w
    position = np.minimum(np.searchsorted(table_keys, query_keys), len(table_keys) - 1)
    return position, table_keys[position] == query_keys


SEARCH_CHUNK = 256  # queries per stretch of the table searched at once
CACHED_TABLE = 1 << 20  # entries (8 MiB): a smaller table stays in cache, searched whole at once
RELEASE_AT_LEAST = 1 << 24  # bytes: a smaller memory-mapped array stays mapped after scoring
SCORE_SLICE = 1 << 16  # sorted targets scored together (a task): one stretch of every order's tables


def _search(table: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """`searchsorted` clipped to the table, for (mostly) sorted queries: each run of SEARCH_CHUNK queries is
    searched only within the stretch of the table that its smallest and largest query bound, so the probes stay
    in a small, cached part of a large (memory-mapped) table instead of starting from its ends."""
    if len(queries) <= SEARCH_CHUNK or len(table) <= CACHED_TABLE:
        return np.minimum(np.searchsorted(table, queries), max(len(table) - 1, 0))
    starts = np.arange(0, len(queries), SEARCH_CHUNK)
    lows = np.searchsorted(table, np.minimum.reduceat(queries, starts))
    highs = np.searchsorted(table, np.maximum.reduceat(queries, starts), side="right")
    position, table = np.empty(len(queries), dtype=np.int64), table.view(np.ndarray)  # a plain view slices faster
    for start, low, high in zip(starts.tolist(), lows.tolist(), highs.tolist()):
        stop = start + SEARCH_CHUNK
        position[start:stop] = low + np.searchsorted(table[low:high], queries[start:stop])
    return np.minimum(position, len(table) - 1)


def _release(array: np.ndarray, read: np.ndarray) -> None:
    """Drop the pages of a memory-mapped array between its smallest and largest `read` index from this process;
    they stay in the page cache for the next read. Small arrays are left mapped."""
    mapping = array.base if isinstance(array, np.memmap) else None
    if not isinstance(mapping, mmap.mmap) or array.nbytes < RELEASE_AT_LEAST or len(read) == 0:
        return  # not a whole memory-mapped array (a view of one has another offset), small, or nothing read
    data = array.offset % mmap.ALLOCATIONGRANULARITY  # where the array starts within its mapping
    start = data + int(read.min()) * array.itemsize
    start -= start % mmap.PAGESIZE
    mapping.madvise(mmap.MADV_DONTNEED, start, data + (int(read.max()) + 1) * array.itemsize - start)


def _pack(tokens: list[int]) -> int:
    """Context key of a token list (oldest first): the most recent token highest, as `context_keys` packs."""
    key = 0
    for j, token in enumerate(tokens):
        key |= token << (BITS * j)
    return key


def perplexity(log_probs: np.ndarray, words: int, n_bytes: int) -> dict:
    """The study's perplexities from per-token natural-log probabilities."""
    return perplexities(-float(np.sum(log_probs)), len(log_probs), words, n_bytes)


def _tokens_of(contexts: np.ndarray, words: np.ndarray, k: int) -> np.ndarray:
    """(n, k) token matrix of order-k n-grams, oldest token first."""
    columns = [(contexts >> np.uint64(BITS * j)) & TOKEN_MASK for j in range(k - 1)]
    return np.stack(columns + [words], axis=1).astype(np.int64)


ARPA_CHUNK = 1 << 20  # n-grams formatted at a time: the export's memory does not grow with the model


def write_arpa(model: NGramLM, path: str | Path) -> dict:
    """Export an interpolated Kneser-Ney model in ARPA backoff form (KenLM, SRILM), streamed to disk.

    Tokens are written as their ids; the boundary is `</s>` when predicted and `<s>` as context.
    Each listed n-gram carries its full interpolated log10 probability, each context its backoff
    log10(gamma), so backoff arithmetic reproduces the interpolated model exactly.
    """
    if model.method != "kneser_ney":
        raise ValueError(f"ARPA export needs a backoff-form model (kneser_ney), not {model.method}")
    names = np.array([str(i) for i in range(model.vocab_size)], dtype=object)
    names[model.boundary] = "</s>"
    counts = {k: (model.vocab_size + 2 if k == 1 else len(model.tables[k - 1].keys)) for k in range(1, model.order + 1)}
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as out:
        out.write("\\data\\\n" + "".join(f"ngram {k}={n}\n" for k, n in counts.items()) + "\n")
        for k in range(1, model.order + 1):
            out.write(f"\\{k}-grams:\n")
            n = model.vocab_size if k == 1 else len(model.tables[k - 1].keys)
            for start in range(0, n, ARPA_CHUNK):
                out.writelines(_arpa_rows(model, k, names, slice(start, min(n, start + ARPA_CHUNK))))
            if k == 1:
                out.write(f"-99\t<s>{_bos_backoff(model)}\n-99\t<unk>\n")
            out.write("\n")
        out.write("\\end\\\n")
    os.replace(tmp, path)
    return counts


def _arpa_rows(model: NGramLM, k: int, names: np.ndarray, rows: slice) -> list[str]:
    """ARPA lines of the order-k n-grams in `rows` (for k = 1: of the word ids in `rows`)."""
    table = model.tables[k - 1]
    if k == 1:
        words = np.arange(rows.start, rows.stop, dtype=np.uint64)
        contexts = np.zeros(len(words), dtype=np.uint64)
    else:
        keys = np.asarray(table.keys[rows])
        contexts, words = np.asarray(table.contexts)[(keys >> WORD_SHIFT).astype(np.int64)], keys & np.uint64(0xFFFFFFFF)
    # the context as seen from order j: its most recent j - 1 tokens, the highest bits (orders above k unused)
    by_order = [contexts >> np.uint64(BITS * (k - j)) if 1 < j <= k else np.zeros_like(contexts)
                for j in range(1, model.order + 1)]
    prob = model._probabilities(by_order, np.full(len(words), k - 1), words)
    tokens = _tokens_of(contexts, words, k)
    backoff = np.full(len(words), np.nan)  # of each n-gram as a context one order up: gamma numerator / total
    if k < model.order:
        upper = model.tables[k]
        key = np.zeros(len(words), dtype=np.uint64)
        for j in range(k):
            key |= tokens[:, j].astype(np.uint64) << np.uint64(BITS * j)
        ci = np.minimum(np.searchsorted(upper.contexts, key), len(upper.contexts) - 1)
        seen = upper.contexts[ci] == key
        backoff = np.where(seen, upper.context_gamma[ci] / np.where(seen, upper.context_total[ci], 1), np.nan)
    lines = []
    for p, row, b in zip(np.log10(prob), tokens, backoff):
        text = " ".join("<s>" if (j == 0 and k > 1 and t == model.boundary) else names[t] for j, t in enumerate(row))
        lines.append(f"{p:.7f}\t{text}" + ("" if np.isnan(b) else f"\t{np.log10(b) if b > 0 else -99:.7f}") + "\n")
    return lines


def _bos_backoff(model: NGramLM) -> str:
    """The backoff weight of <s> as a unigram context, from the bigram table ('' for a unigram model)."""
    if model.order == 1:
        return ""
    start, key = model.tables[1], np.uint64(model.boundary)
    ci = int(np.searchsorted(start.contexts, key))
    if ci < len(start.contexts) and start.contexts[ci] == key:
        return f"\t{np.log10(start.context_gamma[ci] / start.context_total[ci]):.7f}"
    return ""
