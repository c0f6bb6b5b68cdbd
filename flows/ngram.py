"""ngram stage: the n-gram baseline on the BPE tokens; models/ngram/ and metrics/ngram.json."""

import resource
import time

from prefect import flow, task

from flows._stage import PARAMS_FILE, main, stage_run
from lmpipe import tracking
from lmpipe.config import load_params
from lmpipe.io import atomic_path, write_json
from lmpipe.ngram import NGramLM, perplexity
from lmpipe.splits import load_tokens

MODEL_DIR, METRICS = "models/ngram", "metrics/ngram.json"


@task
def build_and_score(params) -> dict:
    data = load_tokens()
    started = time.perf_counter()
    model = NGramLM(params.order, data.vocab_size, data.boundary, params.method, k=params.k, alpha=params.alpha)
    model.fit(data.splits["train"].tokens)
    build_seconds = time.perf_counter() - started
    metrics = {"order": params.order, "method": params.method, "normalised": model.normalised,
               "n_params": model.n_ngrams, "build_seconds": round(build_seconds, 3),
               "tokens_per_sec": round(len(data.splits["train"].tokens) / build_seconds, 1)}  # training throughput
    for name in ("valid", "test"):
        split = data.splits[name]
        started = time.perf_counter()
        metrics[name] = perplexity(model.token_log_probs(split.tokens), split.words, split.bytes)
        metrics[f"{name}_score_tokens_per_sec"] = round(len(split.tokens) / (time.perf_counter() - started), 1)
    metrics["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    with atomic_path(MODEL_DIR) as tmp:
        model.save(tmp)
    return metrics


@flow(name="ngram")
def ngram() -> dict:
    params = load_params(PARAMS_FILE)
    with stage_run("ngram", params, ["ngram"], model="ngram"):
        metrics = build_and_score(params.ngram)
        tracking.mark_output(MODEL_DIR)
        write_json(METRICS, metrics)
        tracking.log_metrics({
            "valid_ppl": metrics["valid"]["ppl"], "test_ppl": metrics["test"]["ppl"],
            "test_word_ppl": metrics["test"]["word_ppl"], "test_bpb": metrics["test"]["bpb"],
            "test_loss": metrics["test"]["loss"], "n_params": metrics["n_params"],
            "tokens_per_sec": metrics["tokens_per_sec"],
            "build_seconds": metrics["build_seconds"], "peak_rss_mb": metrics["peak_rss_mb"],
        })
        tracking.log_artifacts(METRICS)
        tracking.log_artifacts(MODEL_DIR, "model")
    return metrics


if __name__ == "__main__":
    main(ngram)
