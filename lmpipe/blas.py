"""One BLAS kernel for every x86-64 CPU with AVX2, so a stage whose numbers come from OpenBLAS gives the same bytes on
every CPU generation.

OpenBLAS (inside NumPy's and SciPy's wheels) picks its kernels by CPU model at load time: gensim's word2vec, which
trains through SciPy's `sdot`/`saxpy`, gives other vectors under other kernels, and NumPy's dot products move the
WEAT effect sizes by ~1e-15. A Zen 4 and a Zen 5 pick SkylakeX (AVX-512) by themselves, a Zen 3 Haswell (AVX2), and
some machines set OPENBLAS_CORETYPE=Haswell in their environment (some Zen 5 hosts do: older OpenBLAS builds
fail on them), which a project must not override. So the kernel is the one every such CPU can run and that such an
environment chooses: Haswell, on any CPU with AVX2 and FMA, AVX-512 or not (OPENBLAS_CORETYPE, which OpenBLAS reads
once, when the library loads). Measured on a Zen 5: word2vec's vectors under Haswell are the same bytes with the
environment's setting and with this pin, and other bytes under SkylakeX. A user's own OPENBLAS_CORETYPE wins; with
another value than Haswell, word2vec and the WEAT effect sizes may differ in their last digits from the committed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

AVX2 = frozenset({"avx2", "fma"})  # what OpenBLAS's Haswell kernels need


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
    """The OpenBLAS core type for these instruction sets: Haswell wherever it runs (AVX-512 CPUs included); None
    (OpenBLAS's own choice) on other architectures."""
    return "Haswell" if AVX2 <= flags else None


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
