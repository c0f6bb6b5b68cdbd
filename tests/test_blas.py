"""The word2vec and audit stages run the same OpenBLAS kernels (Haswell) on every x86-64 CPU with AVX2."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from lmpipe.blas import cpu_flags, kernel_for
from tests.helpers import ROOT

ZEN4 = "fpu sse2 avx avx2 fma avx512f avx512dq avx512cd avx512bw avx512vl avx512_bf16 avx512vnni"
ZEN3 = "fpu sse2 avx avx2 fma bmi2"


def test_every_cpu_with_avx2_runs_the_haswell_kernels(tmp_path):
    """AVX-512 or not (a Zen 4 and a Zen 5 would pick SkylakeX by themselves): the kernels that this workplace's Zen 5
    machines name in their environment, so a stage's bytes are the same everywhere."""
    for flags, core in ((ZEN4, "Haswell"), (ZEN4 + " avx512_vp2intersect", "Haswell"), (ZEN3, "Haswell"),
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


WORD2VEC_PROBE = """
import flows.word2vec, hashlib, random
from gensim.models import Word2Vec
rng = random.Random(0)
words = [f"w{i}" for i in range(300)]
sentences = [[rng.choice(words) for _ in range(20)] for _ in range(2000)]
model = Word2Vec(sentences, vector_size=64, window=5, min_count=1, epochs=2, sg=1, seed=1, workers=1,
                 hashfxn=flows.word2vec.stable_hash)
print(hashlib.sha256(model.wv.vectors.tobytes()).hexdigest())
"""


def word2vec_bytes(env: dict) -> str:
    done = subprocess.run([sys.executable, "-c", WORD2VEC_PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300, check=True)
    return done.stdout.strip().splitlines()[-1]


def test_word2vec_gives_the_same_bytes_with_the_pin_and_with_an_environment_that_names_haswell():
    """The Zen 5 case: the machine's environment says OPENBLAS_CORETYPE=Haswell, a fresh clone elsewhere has none."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENBLAS_")}
    if kernel_for(cpu_flags()) is None:
        pytest.skip("no AVX2: OpenBLAS chooses its own kernels here")
    pinned = word2vec_bytes(env)
    assert word2vec_bytes({**env, "OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_L2_SIZE": "512"}) == pinned
    if {"avx512f", "avx512bw", "avx512vl"} <= cpu_flags():  # the kernels it would pick by itself give other bytes
        assert word2vec_bytes({**env, "OPENBLAS_CORETYPE": "SkylakeX"}) != pinned
