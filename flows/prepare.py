"""prepare stage: clean, split by article, write data/clean/{train,valid,test}.txt and metrics/corpus.json."""

from prefect import flow, task

from lmpipe import paths
from flows._stage import PARAMS_FILE, main, stage_run
from lmpipe import tracking
from lmpipe.config import load_params
from lmpipe.corpus.prepare import prepare_corpus
from lmpipe.io import write_json

RAW_DIR, CLEAN_DIR, METRICS = paths.RAW, paths.CLEAN, paths.CORPUS_METRICS


@task
def clean_and_split(corpus, split) -> dict:
    return prepare_corpus(RAW_DIR, CLEAN_DIR, corpus, split)


@flow(name="prepare")
def prepare() -> dict:
    params = load_params(PARAMS_FILE)
    with stage_run("prepare", params, ["corpus", "split"]):
        metrics = clean_and_split(params.corpus, params.split)
        write_json(METRICS, metrics)
        tracking.log_metrics(metrics["splits"])
        tracking.log_artifacts(METRICS)
    return metrics


if __name__ == "__main__":
    main(prepare)
