"""ngram stage: the n-gram baseline on the BPE tokens; models/ngram/ and metrics/ngram.json.

The build is lmpipe.ngram_build's map and reduce within `ngram.memory`: its shard and partition steps run as
Prefect tasks, on local threads, or on the study's Dask/Ray cluster when `orchestration.task_runner` names one.
"""

import os
import resource
import time
from pathlib import Path

from prefect import flow, task
from prefect.task_runners import ThreadPoolTaskRunner

from lmpipe import paths
from flows._stage import PARAMS_FILE, main, stage_run
from lmpipe import ngram_build, tracking
from lmpipe.paths import BASELINE
from lmpipe.config import load_params
from lmpipe.io import atomic_path, without_timings, write_json
from lmpipe.ngram import NGramLM, perplexity
from lmpipe.splits import load_tokens

MODEL_DIR, METRICS, WORK_DIR = paths.NGRAM, paths.NGRAM_METRICS, f"{paths.CACHE}/ngram"
TOKENS = paths.TRAIN_TOKENS


@flow(name="ngram-build", flow_run_name="ngram-build")
def build_model(tokens: str, out: str, vocab_size: int, boundary: int, settings: dict, workers: int) -> dict:
    """The out-of-core build; each of its steps is one Prefect task per shard or partition on this flow's runner."""
    def map_tasks(step, arguments):
        as_task = task(step, name=step.__name__.replace("_", "-"))
        futures = [as_task.submit(*args) for args in arguments]
        return [future.result() for future in futures]

    return ngram_build.build(Path(tokens).resolve(), out, Path(WORK_DIR).resolve(), vocab_size=vocab_size,
                             boundary=boundary, workers=workers, map_tasks=map_tasks, **settings)


def runner_and_workers(params):
    """Local threads by default (NumPy's sorts release the GIL); the study's cluster when one is named."""
    orchestration = params.orchestration
    if orchestration.task_runner == "sequential":
        workers = params.ngram.workers or os.cpu_count() or 1
        return ThreadPoolTaskRunner(max_workers=workers), workers
    from flows.runners import task_runner

    return task_runner(orchestration), orchestration.workers


def build_and_score(params) -> dict:
    data, settings = load_tokens(), params.ngram
    runner, workers = runner_and_workers(params)
    started = time.perf_counter()
    with atomic_path(MODEL_DIR) as tmp:
        plan = build_model.with_options(task_runner=runner)(
            TOKENS, str(tmp), data.vocab_size, data.boundary, workers=workers,
            settings={"order": settings.order, "method": settings.method, "k": settings.k,
                      "alpha": settings.alpha, "memory": int(settings.memory)})
    build_seconds = time.perf_counter() - started
    model = NGramLM.load(MODEL_DIR)
    metrics = {"order": settings.order, "method": settings.method, "normalised": model.normalised,
               "n_params": model.n_ngrams, "train_tokens": model.total_tokens, "build_seconds": round(build_seconds, 3),
               "tokens_per_sec": round(len(data.splits["train"].tokens) / build_seconds, 1),  # training throughput
               "build": {**plan, "memory_bytes": int(settings.memory)}}
    for name in ("valid", "test"):
        split = data.splits[name]
        started = time.perf_counter()
        metrics[name] = perplexity(model.token_log_probs(split.tokens), split.words, split.bytes)
        metrics[f"{name}_score_tokens_per_sec"] = round(len(split.tokens) / (time.perf_counter() - started), 1)
    metrics["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    return metrics


@flow(name="ngram")
def ngram() -> dict:
    params = load_params(PARAMS_FILE)
    with stage_run("ngram", params, ["ngram"], model=BASELINE):
        metrics = build_and_score(params)
        tracking.mark_output(MODEL_DIR)
        write_json(METRICS, without_timings(metrics))  # timings: MLflow only
        tracking.log_metrics({
            "valid_ppl": metrics["valid"]["ppl"], "test_ppl": metrics["test"]["ppl"],
            "test_word_ppl": metrics["test"]["word_ppl"], "test_bpb": metrics["test"]["bpb"],
            "test_loss": metrics["test"]["loss"], "n_params": metrics["n_params"],
            "tokens_per_sec": metrics["tokens_per_sec"],
            "build_seconds": metrics["build_seconds"], "peak_rss_mb": metrics["peak_rss_mb"],
        })
        tracking.log_compare_axes(BASELINE, metrics["n_params"], metrics["train_tokens"])
        tracking.log_artifacts(METRICS)
        tracking.log_artifacts(MODEL_DIR, "model")
    return metrics


if __name__ == "__main__":
    main(ngram)
