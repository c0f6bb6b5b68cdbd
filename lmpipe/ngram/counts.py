"""Counting n-grams over a token stream: keys packed 16 bits a token, raw and Kneser-Ney counts, discounts.

An n-gram is (context key, word) with the context's tokens packed 16 bits each into a uint64, the most recent token
highest, so the n-grams of one most recent token are contiguous in sorted order (the partitions of the out-of-core
build, lmpipe.ngram_build). One NumPy pass per order.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

BITS = 16
TOKEN_MASK = np.uint64((1 << BITS) - 1)
WORD_BITS = np.uint64(BITS)
WORD_SHIFT = np.uint64(32)
@dataclass
class OrderTable:
    """Everything one order needs for lookups, all arrays sorted for `searchsorted`."""

    contexts: np.ndarray  # uint64, sorted unique context keys
    context_total: np.ndarray  # float64, sum of counts over the context's words (A(h) or c(h))
    context_gamma: np.ndarray  # float64, D1*N1 + D2*N2 + D3*N3+ of the context (numerator of gamma)
    keys: np.ndarray  # uint64, sorted (context index << 32 | word)
    counts: np.ndarray  # float64, the count of each n-gram used at this order (raw or continuation)


TABLE_FIELDS = tuple(f.name for f in fields(OrderTable))


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
    if fits_one_key(contexts):  # up to 3 context tokens: one uint64 key, one plain sort, faster than lexsort
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


def fits_one_key(contexts: np.ndarray) -> bool:
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
    position, found = find_pairs(suffix_c, suffix_w, contexts, words)
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


def find_pairs(table_c: np.ndarray, table_w: np.ndarray, query_c: np.ndarray, query_w: np.ndarray):
    """Index of each query (context, word) pair in a table sorted by (context, word), and whether it is there."""
    if len(table_c) == 0:  # a partition can hold order-k n-grams none of which is extended at order k + 1
        return np.zeros(len(query_c), dtype=np.int64), np.zeros(len(query_c), dtype=bool)
    if fits_one_key(table_c) and fits_one_key(query_c):
        table_keys, query_keys = (table_c << WORD_BITS) | table_w, (query_c << WORD_BITS) | query_w
    else:
        all_contexts = np.unique(np.concatenate([table_c, query_c]))
        table_keys = (np.searchsorted(all_contexts, table_c).astype(np.uint64) << WORD_SHIFT) | table_w
        query_keys = (np.searchsorted(all_contexts, query_c).astype(np.uint64) << WORD_SHIFT) | query_w
    position = np.minimum(np.searchsorted(table_keys, query_keys), len(table_keys) - 1)
    return position, table_keys[position] == query_keys


def pack(tokens: list[int]) -> int:
    """Context key of a token list (oldest first): the most recent token highest, as `context_keys` packs."""
    key = 0
    for j, token in enumerate(tokens):
        key |= token << (BITS * j)
    return key


def tokens_of(contexts: np.ndarray, words: np.ndarray, k: int) -> np.ndarray:
    """(n, k) token matrix of order-k n-grams, oldest token first."""
    columns = [(contexts >> np.uint64(BITS * j)) & TOKEN_MASK for j in range(k - 1)]
    return np.stack(columns + [words], axis=1).astype(np.int64)
