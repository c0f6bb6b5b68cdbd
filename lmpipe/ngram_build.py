"""Out-of-core n-gram estimation: the tables of `NGramLM.fit`, bit for bit, within a memory bound.

The design of KenLM's lmplz (Heafield et al. 2013, "Scalable Modified Kneser-Ney Language Model
Estimation"): count in shards, spill sorted runs, merge, derive continuation counts and discounts from
the merged tables, write the model without holding it. Here as a map and a reduce over NumPy arrays:

1. map, one task per shard of the token stream: count its n-grams of every order (NumPy sort) and spill
   them sorted by (context, word), indexed by their most recent context token (`offsets`).
2. reduce, one task per partition (a range of most recent tokens, sized from the map's offsets to fit
   the bound): merge the shards' runs of the partition and adjust the counts. Locality holds because the
   order-(k+1) n-grams that give an order-k n-gram its continuation count share its most recent token,
   and so do all n-grams of one context: nothing of an order k >= 2 crosses a partition.
3. the discounts, from the partitions' counts-of-counts summed; the unigrams (tiny), in the driver.
4. write, one task per partition: its rows of the final tables, in place in memory-mapped .npy files
   (the key packing puts the most recent token highest, so a partition's rows are contiguous).

Tasks take paths and plain numbers, so any executor runs them: `map_tasks` is a function that maps a
task over argument tuples (sequential by default; the ngram flow passes Prefect task submission, on
threads or on the study's Dask/Ray runner).
"""

from __future__ import annotations

import json
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from lmpipe.ngram.counts import (BITS, TABLE_FIELDS, adjusted_counts, count_ngrams, counts_of_counts,
                                 modified_kn_discounts, order_table, unique_ngrams)
from lmpipe.ngram.model import NGramLM

# Peak bytes per token while a shard is counted (stream, positions, keys and sort permutations of
# one order, the unique n-grams of all orders), and per n-gram while a partition is merged or written
# (the merged order and the one above it, their sort): measured on the default corpus, rounded up.
MAP_BYTES_PER_TOKEN = 240
REDUCE_BYTES_PER_NGRAM = 160
MIN_SHARD_TOKENS = 256

MapTasks = Callable[[Callable, list[tuple]], list]


def sequential(task: Callable, arguments: list[tuple]) -> list:
    return [task(*args) for args in arguments]


@dataclass(frozen=True)
class BuildSpec:
    """What every task needs to know: plain values, so that a task pickles to a Dask or Ray worker."""

    tokens: str  # .npy of the token stream (uint16), read memory-mapped
    work: str  # spill folder
    out: str  # model folder being written
    order: int
    vocab_size: int
    boundary: int
    method: str

    def run(self, shard: int, k: int, field: str) -> Path:
        return Path(self.work) / f"s{shard}_k{k}_{field}.npy"

    def part(self, part: int, k: int, field: str) -> Path:
        return Path(self.work) / f"p{part}_k{k}_{field}.npy"

    def final(self, field: str, k: int) -> Path:
        return Path(self.out) / f"{field}_{k}.npy"


# ---------- 1. map ----------
def count_shard(job: BuildSpec, shard: int, start: int, stop: int) -> None:
    """Count the n-grams predicting tokens[start:stop] and spill them, one sorted run per order."""
    tokens = np.load(job.tokens, mmap_mode="r")
    # the stream is a boundary followed by the tokens; a shard also reads the order - 1 tokens before it
    first_token = max(0, start - (job.order - 1))
    piece = np.asarray(tokens[first_token:stop], dtype=np.int64)
    if first_token == 0:
        stream, first = np.concatenate([[job.boundary], piece]), start + 1
    else:
        stream, first = piece, start - first_token
    for k, (contexts, words, counts) in enumerate(count_ngrams(stream, first, job.boundary, job.order), 1):
        recent = contexts >> np.uint64(BITS * (k - 2)) if k >= 2 else np.zeros(len(contexts), dtype=np.uint64)
        _save(job.run(shard, k, "offsets"), np.searchsorted(recent, np.arange(job.vocab_size + 1)))
        _save(job.run(shard, k, "contexts"), contexts)
        _save(job.run(shard, k, "words"), words.astype(np.uint16))
        _save(job.run(shard, k, "counts"), counts.astype(np.uint32))


# ---------- 2. reduce ----------
def merge_partition(job: BuildSpec, part: int, shards: int, lo: int, hi: int) -> dict:
    """Merge the shards' n-grams whose most recent context token is in [lo, hi) and adjust their counts.

    Spills each order's (contexts, words, adjusted counts); returns per order the counts-of-counts, the
    numbers of rows and contexts, and the bigrams per word (the unigrams' continuation counts).
    """
    stats, above = {}, None
    for k in range(job.order, 1, -1):
        raw = unique_ngrams(*_gather(job, shards, k, lo, hi))
        counts = adjusted_counts(k, job.order, job.method, job.boundary, raw, above)
        contexts, words = raw[0], raw[1]
        _save(job.part(part, k, "contexts"), contexts)
        _save(job.part(part, k, "words"), words)
        _save(job.part(part, k, "counts"), counts)
        distinct = int(np.count_nonzero(contexts[1:] != contexts[:-1])) + (len(contexts) > 0)
        stats[k] = {"counts_of_counts": counts_of_counts(counts).tolist(), "rows": len(contexts),
                    "contexts": distinct}
        if k == 2:
            stats["bigrams_per_word"] = np.bincount(words.astype(np.int64), minlength=job.vocab_size).tolist()
        above = raw
    return stats


def _gather(job: BuildSpec, shards: int, k: int, lo: int, hi: int):
    """The partition's slice of every shard's run of order k, concatenated."""
    parts = {"contexts": [], "words": [], "counts": []}
    for shard in range(shards):
        offsets = np.load(job.run(shard, k, "offsets"))
        rows = slice(int(offsets[lo]), int(offsets[hi]))
        for field, pieces in parts.items():
            pieces.append(np.load(job.run(shard, k, field), mmap_mode="r")[rows])
    contexts, words, counts = (np.concatenate(parts[f]) for f in ("contexts", "words", "counts"))
    return contexts, words.astype(np.uint64), counts.astype(np.int64)


# ---------- 4. write ----------
def write_partition(job: BuildSpec, part: int, k: int, discounts: list | None, first_row: int, first_context: int) -> None:
    """Write the partition's rows of the order-k tables into the preallocated memory-mapped files."""
    contexts = np.load(job.part(part, k, "contexts"))
    table = order_table(contexts, np.load(job.part(part, k, "words")), np.load(job.part(part, k, "counts")),
                        None if discounts is None else np.asarray(discounts), first_context)
    for field in TABLE_FIELDS:
        values = getattr(table, field)
        first = first_context if field.startswith("context") else first_row
        target = np.load(job.final(field, k), mmap_mode="r+")
        target[first:first + len(values)] = values
        target.flush()
        del target


# ---------- the driver ----------
def build(tokens_path: str | Path, out: str | Path, work: str | Path, order: int, vocab_size: int, boundary: int,
          method: str = "kneser_ney", k: float = 0.01, alpha: float = 0.4, memory: int = 4 << 30,
          workers: int = 1, map_tasks: MapTasks = sequential) -> dict:
    """Build the model of `NGramLM.fit` into `out` (a new folder) with at most `memory` bytes in use at once.

    `workers` tasks may run at the same time; each gets memory / workers. Spill files go to a fresh folder
    under `work`, removed at the end. Returns the plan (shards, partitions) for the record.
    """
    tokens = np.load(tokens_path, mmap_mode="r")
    budget = max(1, memory // max(1, workers))
    shard_tokens = max(MIN_SHARD_TOKENS, budget // MAP_BYTES_PER_TOKEN)
    bounds = list(range(0, len(tokens), shard_tokens)) + [len(tokens)]
    job = BuildSpec(str(tokens_path), str(Path(work) / uuid.uuid4().hex), str(out), order, vocab_size, boundary, method)
    Path(job.work).mkdir(parents=True)
    Path(out).mkdir(parents=True, exist_ok=True)
    try:
        shards = len(bounds) - 1
        map_tasks(count_shard, [(job, s, bounds[s], bounds[s + 1]) for s in range(shards)])
        ranges = plan_partitions(job, shards, budget // REDUCE_BYTES_PER_NGRAM)
        stats = map_tasks(merge_partition, [(job, p, shards, lo, hi) for p, (lo, hi) in enumerate(ranges)])
        model = NGramLM(order, vocab_size, boundary, method, k=k, alpha=alpha)
        model.total_tokens = len(tokens)
        unigram = _unigram_table(job, model, shards, stats)
        writes = []
        for n in range(2, order + 1):
            if method == "kneser_ney":
                model.discounts[n - 1] = modified_kn_discounts(n=np.sum([s[n]["counts_of_counts"] for s in stats], axis=0))
            rows = np.cumsum([0] + [s[n]["rows"] for s in stats])
            contexts = np.cumsum([0] + [s[n]["contexts"] for s in stats])
            _allocate(job, n, int(rows[-1]), int(contexts[-1]))
            discounts = model.discounts[n - 1].tolist() if method == "kneser_ney" else None
            writes += [(job, p, n, discounts, int(rows[p]), int(contexts[p])) for p in range(len(ranges))]
        map_tasks(write_partition, writes)
        for field in TABLE_FIELDS:
            np.save(job.final(field, 1), getattr(unigram, field))
        np.save(Path(out) / "discounts.npy", model.discounts)
        (Path(out) / "ngram.json").write_text(json.dumps(model.meta(), indent=2))
    finally:
        shutil.rmtree(job.work, ignore_errors=True)
    return {"shards": shards, "shard_tokens": shard_tokens, "partitions": len(ranges), "workers": workers}


def plan_partitions(job: BuildSpec, shards: int, max_ngrams: int) -> list[tuple[int, int]]:
    """Ranges [lo, hi) of most recent tokens whose n-grams (an upper bound: the runs' rows) fit `max_ngrams`.

    Merging order k holds order k + 1's n-grams too, so a range's load is the largest over k of both orders' rows.
    """
    rows = {n: sum(np.diff(np.load(job.run(s, n, "offsets"))) for s in range(shards)) for n in range(2, job.order + 1)}
    if not rows:  # a unigram model: one partition with nothing in it
        return [(0, job.vocab_size)]
    load = np.cumsum(np.stack([rows[n] + rows.get(n + 1, 0) for n in rows]), axis=1)
    load = np.concatenate([np.zeros((len(rows), 1), dtype=load.dtype), load], axis=1)  # load[:, t] = sum below t
    ranges, lo = [], 0
    while lo < job.vocab_size:
        reach = min(int(np.searchsorted(row, row[lo] + max_ngrams, side="right")) - 1 for row in load)
        hi = min(job.vocab_size, max(lo + 1, reach))  # a single token over the bound still gets its own range
        ranges.append((lo, hi))
        lo = hi
    return ranges


def _unigram_table(job: BuildSpec, model: NGramLM, shards: int, stats: list[dict]):
    """Order 1 in the driver: at most vocab_size rows, raw counts summed over shards or continuation counts."""
    words, counts = [], []
    for s in range(shards):
        words.append(np.load(job.run(s, 1, "words")).astype(np.int64))
        counts.append(np.load(job.run(s, 1, "counts")).astype(np.int64))
    raw = np.bincount(np.concatenate(words), weights=np.concatenate(counts), minlength=job.vocab_size)
    seen = np.flatnonzero(raw > 0)
    used = raw[seen].astype(np.float64)
    if job.method == "kneser_ney" and job.order > 1:
        used = np.sum([s["bigrams_per_word"] for s in stats], axis=0)[seen].astype(np.float64)
    discounts = None
    if job.method == "kneser_ney":
        model.discounts[0] = discounts = modified_kn_discounts(used)
    return order_table(np.zeros(len(seen), dtype=np.uint64), seen.astype(np.uint64), used, discounts)


def _allocate(job: BuildSpec, k: int, rows: int, contexts: int) -> None:
    dtypes = {"contexts": np.uint64, "context_total": np.float64, "context_gamma": np.float64,
              "keys": np.uint64, "counts": np.float64}
    for field in TABLE_FIELDS:
        shape = (contexts,) if field.startswith("context") else (rows,)
        np.lib.format.open_memmap(job.final(field, k), mode="w+", dtype=dtypes[field], shape=shape).flush()


def _save(path: Path, array: np.ndarray) -> None:
    np.save(path, np.ascontiguousarray(array))


