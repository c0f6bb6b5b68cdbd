"""validate stage: the Great Expectations gate; a failed expectation fails the pipeline."""

from prefect import flow, get_run_logger, task

from lmpipe import paths
from flows._stage import PARAMS_FILE, main, stage_run
from lmpipe import tracking
from lmpipe.config import load_params
from lmpipe.errors import ValidationFailed
from lmpipe.io import write_json
from lmpipe.validation import validate_corpus

CLEAN_DIR, DOCS_DIR, METRICS = paths.CLEAN, paths.VALIDATION_DOCS, paths.VALIDATION_METRICS


@task
def run_suite(params) -> dict:
    return validate_corpus(CLEAN_DIR, params, DOCS_DIR)


@flow(name="validate")
def validate() -> dict:
    params = load_params(PARAMS_FILE)
    with stage_run("validate", params, ["validate"]):
        report = run_suite(params.validate_)
        write_json(METRICS, report)
        tracking.log_metrics({k: report[k] for k in ("success", "evaluated", "failed")} | {"passed": int(report["success"])})
        tracking.log_artifacts(METRICS)
        tracking.log_artifacts(DOCS_DIR, "data_docs")
    if not report["success"]:
        for line in report["failures"]:
            get_run_logger().error(line)
        raise ValidationFailed(
            f"{CLEAN_DIR}: {report['failed']} of {report['evaluated']} expectations failed: "
            + "; ".join(report["failures"]) + f" (details: {DOCS_DIR}/index.html)"
        )
    return report


if __name__ == "__main__":
    main(validate)
