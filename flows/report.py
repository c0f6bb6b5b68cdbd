"""report stage: reports/study.md and a self-contained reports/study.html, logged to the study's MLflow run."""

from prefect import flow, task

from flows._stage import PARAMS_FILE, main, stage_run
from lmpipe import tracking
from lmpipe.config import load_params
from lmpipe.report import build_report

OUT_DIR = "reports"  # study.md, study.html, figures/ (beside validation/ and samples.md of earlier stages)


@task
def write_report() -> str:
    return str(build_report(".", OUT_DIR))


@flow(name="report")
def report() -> str:
    params = load_params(PARAMS_FILE)
    with stage_run("report", params, []) as run:
        path = write_report()
        study = tracking.parent_run_id(run)
        for run_id in [None] + ([study] if study else []):  # the report stage's run, and the study run where a study is compared
            for name, where in (("study.md", "report"), ("study.html", "report"), ("figures", "report/figures")):
                tracking.log_artifacts(f"{OUT_DIR}/{name}", where, run_id=run_id)
    return path


if __name__ == "__main__":
    main(report)
