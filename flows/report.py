"""report stage: reports/study.md and a self-contained reports/study.html with its figures, logged to the stage's
MLflow run, and the offline page of `dvc plots show`. The numbers' other readers (`dvc metrics show`, the MLflow
views, the registry's cards, the study run) are the publish stage's, after it."""

import json
from pathlib import Path

from prefect import flow, task

from lmpipe import paths
from flows._stage import PARAMS_FILE, drop_removed, log_report, main, stage_run
from lmpipe import grid_record, tracking
from lmpipe.compare import baseline_label
from lmpipe.paths import BASELINE
from lmpipe.config import load_params
from lmpipe.errors import LmpipeError
from lmpipe.io import write_text
from lmpipe.report import build_report, dvc_plots_template

OUT_DIR = paths.REPORTS  # study.md, study.html, figures/ (beside validation/ and samples.md of earlier stages)
EVAL, PLOTS_TEMPLATE = paths.EVAL, paths.PLOTS_TEMPLATE


def made_from(params_file: str | Path = PARAMS_FILE) -> str:
    """What the numbers were made from, by content: params.yaml's digest (the one MLflow's study key carries) and the
    corpus's. Not the code's commit, which goes on every MLflow run (`mlflow.source.git.commit`): a code change that
    leaves the numbers as they were then leaves the report as it was too."""
    digest = tracking.runs.study_key(params_file).params_digest
    corpus = json.loads(Path(paths.CORPUS_METRICS).read_text()) if Path(paths.CORPUS_METRICS).exists() else {}
    line = f"the settings in `params.yaml` (sha256 `{digest}`; `dvc params diff` compares)"
    if train := corpus.get("sha256", {}).get("train.txt"):
        line += f" and the corpus `{corpus['source']}` (train.txt sha256 `{train[:12]}`)"
    return line


def check_covers(models: list[str]) -> None:
    """The evaluation must hold exactly the study's models: a stale row is worse than none."""
    evaluated = set(json.loads(Path(EVAL).read_text())["models"]) - {BASELINE}
    if evaluated != set(models):
        raise LmpipeError(f"{EVAL} covers {sorted(evaluated)}, params.yaml's models are {sorted(models)} "
                          "(run the whole pipeline: dvc repro)")


@task
def write_report(params) -> str:
    models = list(params.models)
    check_covers(models)
    for path in drop_removed(models):
        print(f"removed {path}: its model is no longer in params.yaml", flush=True)
    write_text(PLOTS_TEMPLATE, dvc_plots_template())
    return str(build_report(".", OUT_DIR, models, tracking.experiment_tags().get(tracking.EXPERIMENT),
                            study_seed=params.train.seed, label=baseline_label(params.ngram), made_from=made_from(),
                            budget_flops=params.study.flops, budget_exceptions=params.budget_exceptions(),
                            grid_stale=grid_record.stale(params)))


@flow(name="report")
def report() -> str:
    params = load_params(PARAMS_FILE)
    with stage_run("report", params, []):
        path = write_report(params)
        log_report()
    return path


if __name__ == "__main__":
    main(report)
