"""tokenize stage: byte-level BPE on train; data/tokens/{tokenizer.json,train,valid,test.npy}."""

from prefect import flow, task

from lmpipe import paths
from flows._stage import PARAMS_FILE, main, stage_run
from lmpipe import tracking
from lmpipe.config import load_params
from lmpipe.io import without_timings, write_json
from lmpipe.tokenize import tokenize_corpus

CLEAN_DIR, TOKENS_DIR, METRICS = paths.CLEAN, paths.TOKENS, paths.TOKENIZE_METRICS


@task
def train_and_encode(params) -> dict:
    return tokenize_corpus(CLEAN_DIR, TOKENS_DIR, params)


@flow(name="tokenize")
def tokenize() -> dict:
    params = load_params(PARAMS_FILE)
    with stage_run("tokenize", params, ["tokenizer"]):
        metrics = train_and_encode(params.tokenizer)
        write_json(METRICS, without_timings(metrics))  # timings: MLflow only
        tracking.log_metrics(metrics)
        tracking.log_artifacts(METRICS)
        tracking.log_artifacts(f"{TOKENS_DIR}/tokenizer.json")
    return metrics


if __name__ == "__main__":
    main(tokenize)
