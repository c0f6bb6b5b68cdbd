"""Process-wide settings, applied by a stage's `main` and again before each Trainer is built (each call sets the
same values), never on import."""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's mallopt parameters (malloc.h)


def keep_freed_memory() -> bool:
    """Keep freed heap memory in the process instead of returning it to the kernel (glibc only; False elsewhere).

    A training step frees and re-allocates the same large logits and gradient buffers every step. glibc serves each
    from a fresh mmap (above its mmap threshold) and unmaps it when freed, so the kernel zero-fills new pages every
    step: thousands of page faults a step. With mmap off and trimming off, the buffers are reused from the heap. The
    same as starting the process with MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=-1 (or huge); what it saves:
    `python benchmarks/train_throughput.py --malloc`.
    """
    name = ctypes.util.find_library("c")
    if not name:
        return False
    libc = ctypes.CDLL(name)
    if not hasattr(libc, "mallopt") or not hasattr(libc, "gnu_get_libc_version"):  # musl, macOS: no such knobs
        return False
    return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, -1))  # -1: never trim
