"""The word2vec and audit stages run the same OpenBLAS kernels on every CPU of an instruction set."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from lmpipe.blas import cpu_flags, kernel_for
from tests.conftest import ROOT

ZEN4 = "fpu sse2 avx avx2 fma avx512f avx512dq avx512cd avx512bw avx512vl avx512_bf16 avx512vnni"
ZEN3 = "fpu sse2 avx avx2 fma bmi2"


def test_the_kernel_is_named_by_instruction_set_not_by_cpu_model(tmp_path):
    for flags, core in ((ZEN4, "SkylakeX"), (ZEN4 + " avx512_vp2intersect", "SkylakeX"), (ZEN3, "Haswell"),
                        ("fpu sse2 avx", None)):
        (tmp_path / "cpuinfo").write_text(f"processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: {flags}\n")
        assert kernel_for(cpu_flags(tmp_path / "cpuinfo")) == core
    assert cpu_flags(tmp_path / "absent") == frozenset()


def loaded_kernels(module: str, env: dict) -> dict:
    probe = (f"import {module}, threadpoolctl, scipy.linalg, json; "
             "print(json.dumps({i['filepath'].rsplit('/', 1)[-1]: i.get('architecture') "
             "for i in threadpoolctl.threadpool_info() if i['internal_api'] == 'openblas'}))")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_stages_load_numpy_and_scipy_with_the_pinned_kernels():
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    want = kernel_for(cpu_flags())
    for module in ("flows.word2vec", "flows.audit", "flows.scaling_fit"):
        kernels = loaded_kernels(module, env)
        assert len(kernels) == 2, kernels  # NumPy's OpenBLAS and SciPy's (gensim's word2vec trains through it)
        if want is not None:
            assert set(kernels.values()) == {want}, kernels
    # the user's own choice wins
    assert set(loaded_kernels("flows.word2vec", {**env, "OPENBLAS_CORETYPE": "Sandybridge"}).values()) == {"Sandybridge"}
