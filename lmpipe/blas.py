"""One BLAS kernel per instruction set, so a stage whose numbers come from OpenBLAS gives the same bytes on every
CPU generation that has that instruction set.

OpenBLAS (inside NumPy's and SciPy's wheels) picks its kernels by CPU model at load time. Two 2-core EPYCs with the
same AVX-512 instructions got different ones (a Zen 4 and a Zen 5): gensim's word2vec, which trains through SciPy's
`sdot`/`saxpy`, then gave other vectors, and NumPy's dot products moved the WEAT effect sizes by ~1e-15. Naming the
kernel by instruction set (`OPENBLAS_CORETYPE`, which OpenBLAS reads once, when the library loads) removes the CPU
model from the arithmetic: every AVX-512 CPU runs the SkylakeX kernels (what a Zen 4 chose by itself, so the
committed numbers stand), every other AVX2 CPU the Haswell ones.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

AVX512 = frozenset({"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"})  # what OpenBLAS's SkylakeX needs
AVX2 = frozenset({"avx2", "fma"})


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> frozenset[str]:
    """The first CPU's feature flags (empty where there is no /proc/cpuinfo: not Linux, or not x86)."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


def kernel_for(flags: frozenset[str]) -> str | None:
    """The OpenBLAS core type for these instruction sets; None (OpenBLAS's own choice) on other architectures."""
    if AVX512 <= flags:
        return "SkylakeX"
    if AVX2 <= flags:
        return "Haswell"
    return None


def pin_kernel() -> str | None:
    """Pin OpenBLAS's kernels by instruction set, unless the user set OPENBLAS_CORETYPE (theirs wins). Call it before
    anything loads NumPy: OpenBLAS reads the setting once (imported later, as by a test, it changes nothing and
    returns None)."""
    if "OPENBLAS_CORETYPE" in os.environ:
        return os.environ["OPENBLAS_CORETYPE"]
    if "numpy" in sys.modules:
        return None
    core = kernel_for(cpu_flags())
    if core is not None:
        os.environ["OPENBLAS_CORETYPE"] = core
    return core
