"""download stage: bring the corpus named by `corpus.source` into data/raw/ with a sha256 manifest."""

from prefect import flow, task

from flows._stage import PARAMS_FILE, is_transient, main, stage_run
from lmpipe.paths import CACHE_DIR, RAW
from lmpipe import tracking
from lmpipe.config import load_params
from lmpipe.corpus.sources import MANIFEST, fetch_corpus


@task(retries=2, retry_delay_seconds=10, retry_condition_fn=is_transient)
def fetch(corpus) -> dict:
    return fetch_corpus(corpus, RAW, f"{CACHE_DIR}/downloads")


@flow(name="download")
def download() -> dict:
    params = load_params(PARAMS_FILE)
    with stage_run("download", params, ["corpus"]):
        manifest = fetch(params.corpus)
        tracking.log_metrics({"raw_bytes": sum(f["bytes"] for f in manifest["files"].values())})
        tracking.log_artifacts(f"{RAW}/{MANIFEST}")
    return manifest


if __name__ == "__main__":
    main(download)
