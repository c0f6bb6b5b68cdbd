"""The out-of-core n-gram build: the in-memory model's tables bit for bit, in many shards, spills cleaned up, on Dask."""

from __future__ import annotations

import numpy as np
import pytest

from lmpipe import ngram_build
from lmpipe.ngram import TABLE_FIELDS, NGramLM
from tests.helpers import section

V, B = 40, 0  # synthetic vocabulary size and boundary id


def synthetic_stream(n: int, seed: int = 0) -> np.ndarray:
    """Zipf-ish tokens with lines of random length, ending with the boundary: repeated n-grams at every order."""
    rng = np.random.default_rng(seed)
    tokens = np.minimum(rng.zipf(1.3, n), V - 1).astype(np.uint16)
    tokens[rng.random(n) < 0.08] = B
    tokens[-1] = B
    return tokens


def build(tmp_path, tokens, order, method="kneser_ney", memory=4 << 30, workers=1, map_tasks=ngram_build.sequential,
          vocab=V, boundary=B):
    path = tmp_path / "train.npy"
    np.save(path, tokens)
    plan = ngram_build.build(path, tmp_path / "model", tmp_path / "work", order, vocab, boundary, method,
                             memory=memory, workers=workers, map_tasks=map_tasks)
    return NGramLM.load(tmp_path / "model"), plan


def assert_same_model(built: NGramLM, reference: NGramLM) -> None:
    assert built.total_tokens == reference.total_tokens
    np.testing.assert_array_equal(built.discounts, reference.discounts)
    for k in range(reference.order):
        for field in TABLE_FIELDS:
            np.testing.assert_array_equal(getattr(built.tables[k], field), getattr(reference.tables[k], field),
                                          err_msg=f"order {k + 1} {field}")


@pytest.mark.parametrize("method", ["kneser_ney", "add_k", "stupid_backoff"])
@pytest.mark.parametrize("order", [1, 2, 3, 5])
def test_many_shards_and_partitions_give_the_in_memory_model(tmp_path, order, method):
    tokens = synthetic_stream(3000, seed=order)
    reference = NGramLM(order, V, B, method).fit(tokens)
    built, plan = build(tmp_path, tokens, order, method, memory=1)  # the smallest shards, one token per partition
    assert plan["shards"] == 12 and plan["partitions"] == (V if order > 1 else 1)
    assert_same_model(built, reference)
    held_out = synthetic_stream(500, seed=99)
    ours, theirs = built.token_log_probs(held_out), reference.token_log_probs(held_out)
    assert np.abs(ours - theirs).max() <= 1e-12
    assert not (tmp_path / "work").exists() or not any((tmp_path / "work").iterdir())


def test_default_corpus_bounded_build_equals_in_memory(tmp_path, default_tokens):
    tokens, metrics = default_tokens
    vocab, boundary = metrics["vocab_size"], metrics["boundary_id"]
    reference = NGramLM(5, vocab, boundary).fit(tokens["train"])
    built, plan = build(tmp_path, tokens["train"], 5, memory=24 << 20, vocab=vocab, boundary=boundary)
    assert plan["shards"] > 1 and plan["partitions"] > 1  # the bound forced the out-of-core path
    assert_same_model(built, reference)
    np.testing.assert_allclose(built.token_log_probs(tokens["valid"]), reference.token_log_probs(tokens["valid"]),
                               rtol=0, atol=1e-12)


def test_saved_model_loads_memory_mapped(tmp_path):
    built, _ = build(tmp_path, synthetic_stream(2000), 3)
    assert all(isinstance(getattr(t, f), np.memmap) for t in built.tables for f in TABLE_FIELDS)


def test_failed_build_leaves_no_spill_files(tmp_path):
    def failing(task, arguments):
        if task is ngram_build.merge_partition:
            raise RuntimeError("killed")
        return ngram_build.sequential(task, arguments)

    with pytest.raises(RuntimeError, match="killed"):
        build(tmp_path, synthetic_stream(2000), 3, memory=1, map_tasks=failing)
    assert not any((tmp_path / "work").iterdir())


def test_partitions_respect_the_bound_and_cover_every_token(tmp_path):
    tokens = synthetic_stream(3000)
    job = ngram_build.BuildSpec(str(tmp_path / "t.npy"), str(tmp_path), str(tmp_path), 3, V, B, "kneser_ney")
    np.save(job.tokens, tokens)
    ngram_build.count_shard(job, 0, 0, len(tokens))
    for bound in (1, 50, 400, 10**9):
        ranges = ngram_build.plan_partitions(job, 1, bound)
        assert ranges[0][0] == 0 and ranges[-1][1] == V
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
        offsets = {k: np.load(job.run(0, k, "offsets")) for k in (2, 3)}
        for lo, hi in ranges:  # a range holds more than the bound only when it is a single token
            load = max(offsets[k][hi] - offsets[k][lo] for k in (2, 3)) 
            assert hi - lo == 1 or load <= bound
    assert len(ngram_build.plan_partitions(job, 1, 10**9)) == 1


@pytest.mark.slow
def test_two_dask_workers_build_the_same_model(tmp_path, prefect_api):
    """The shard and partition tasks on a 2-worker local Dask cluster, through the ngram flow's build."""
    pytest.importorskip("prefect_dask")
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.ngram import build_model
    from flows.runners import task_runner
    from lmpipe.config import OrchestrationParams

    tokens = synthetic_stream(4000)
    np.save(tmp_path / "train.npy", tokens)
    runner = task_runner(OrchestrationParams(**section("orchestration", task_runner="dask", workers=2)))
    with temporary_settings({PREFECT_API_URL: prefect_api}):
        plan = build_model.with_options(task_runner=runner)(
            str(tmp_path / "train.npy"), str(tmp_path / "model"), V, B, workers=2,
            settings={"order": 4, "method": "kneser_ney", "k": 0.01, "alpha": 0.4, "memory": 1})
    assert plan["shards"] == 16 and plan["workers"] == 2
    assert_same_model(NGramLM.load(tmp_path / "model"), NGramLM(4, V, B).fit(tokens))



def test_scoring_in_slices_on_threads_gives_the_same_numbers(tmp_path, monkeypatch, default_tokens):
    """Sorted targets scored SCORE_SLICE at a time on 2 threads, through the chunked search, each stretch of a
    memory-mapped table released after its order: the single-pass, in-memory numbers, bit for bit."""
    from lmpipe.ngram import lookup, model

    tokens, metrics = default_tokens
    reference = NGramLM(5, metrics["vocab_size"], metrics["boundary_id"]).fit(tokens["train"])
    reference.save(tmp_path / "model")
    expected = reference.token_log_probs(tokens["valid"], workers=1)  # one thread, in memory: nothing released
    for module, name, value in ((model, "SCORE_SLICE", 4096), (lookup, "CACHED_TABLE", 1024),
                                (lookup, "RELEASE_AT_LEAST", 0)):
        monkeypatch.setattr(module, name, value)
    assert len(tokens["valid"]) > 20 * model.SCORE_SLICE
    np.testing.assert_array_equal(NGramLM.load(tmp_path / "model").token_log_probs(tokens["valid"], workers=2),
                                  expected)


def _resident_kib(path) -> int:
    """This process's resident KiB of the file mapped from `path` (Linux /proc/self/smaps)."""
    resident, inside = 0, False
    for line in open("/proc/self/smaps"):
        if line[0] in "0123456789abcdef" and " " in line:  # a mapping's header line
            inside = line.rstrip().endswith(str(path))
        elif inside and line.startswith("Rss:"):
            resident += int(line.split()[1])
    return resident


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/smaps"), reason="needs Linux /proc/self/smaps")
def test_release_drops_the_stretch_read_from_the_process(tmp_path):
    """What keeps scoring's memory to a stretch of one order per thread: the pages read leave the process (the
    kernel may map up to a 2 MiB folio past either end of a read)."""
    from lmpipe.ngram.lookup import release_pages

    np.save(tmp_path / "table.npy", np.arange(8 << 20, dtype=np.uint64))  # 64 MiB
    table = np.load(tmp_path / "table.npy", mmap_mode="r")
    read = np.arange(1 << 20, 7 << 20, 97)
    assert int(table[read].sum()) == int(read.sum())
    assert _resident_kib(tmp_path / "table.npy") >= 44 << 10  # the 48 MiB stretch is mapped
    release_pages(table, read)
    assert _resident_kib(tmp_path / "table.npy") <= 4 << 10
