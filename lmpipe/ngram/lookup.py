"""Searching the sorted, memory-mapped key tables of a saved model without reading them whole.

Queries arrive (mostly) sorted, so each run of them is searched within the stretch of the table it bounds, and the
pages read are dropped from the process afterwards: scoring's memory is a stretch of one order per thread.
"""

from __future__ import annotations

import mmap

import numpy as np

SEARCH_CHUNK = 256  # queries per stretch of the table searched at once
CACHED_TABLE = 1 << 20  # entries (8 MiB): a smaller table stays in cache, searched whole at once
RELEASE_AT_LEAST = 1 << 24  # bytes: a smaller memory-mapped array stays mapped after scoring


def search_sorted(table: np.ndarray, queries: np.ndarray) -> np.ndarray:
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


def release_pages(array: np.ndarray, read: np.ndarray) -> None:
    """Drop the pages of a memory-mapped array between its smallest and largest `read` index from this process;
    they stay in the page cache for the next read. Small arrays are left mapped."""
    mapping = array.base if isinstance(array, np.memmap) else None
    if not isinstance(mapping, mmap.mmap) or array.nbytes < RELEASE_AT_LEAST or len(read) == 0:
        return  # not a whole memory-mapped array (a view of one has another offset), small, or nothing read
    data = array.offset % mmap.ALLOCATIONGRANULARITY  # where the array starts within its mapping
    start = data + int(read.min()) * array.itemsize
    start -= start % mmap.PAGESIZE
    mapping.madvise(mmap.MADV_DONTNEED, start, data + (int(read.max()) + 1) * array.itemsize - start)
