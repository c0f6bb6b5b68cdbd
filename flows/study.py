"""Flows that drive the whole pipeline: `study` (dvc repro / dvc exp run -S ...) and scheduled `retrain`.

Both create the study's MLflow parent run themselves and hand it to every stage (LMPIPE_PARENT_RUN_ID),
and point the stages at this flow's Prefect server (PREFECT_API_URL), so one execution is one study.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact

from flows._stage import PARAMS_FILE, main
from lmpipe import tracking
from lmpipe.compare import compare_eval, comparison_markdown
from lmpipe.config import load_params
from lmpipe.errors import LmpipeError

EVAL = Path("metrics/eval.json")


def _stage_env(parent_run_id: str) -> dict:
    from prefect.settings import PREFECT_API_URL

    env = {**os.environ, "LMPIPE_PARENT_RUN_ID": parent_run_id}
    if PREFECT_API_URL.value():
        env["PREFECT_API_URL"] = PREFECT_API_URL.value()
    return env


@task
def dvc(args: list[str], env: dict) -> str:
    done = subprocess.run(["dvc", *args], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise LmpipeError(f"dvc {' '.join(args)} failed (exit {done.returncode}): "
                          + (done.stderr.strip().splitlines() or ["no output"])[-1])
    return done.stdout


@flow(name="study")
def study(overrides: list[str] | None = None) -> str:
    """Run the pipeline: `dvc repro`, or `dvc exp run -S ...` when overrides (e.g. models.lstm.epochs=4) are given."""
    params = load_params(PARAMS_FILE)
    env = _stage_env(tracking.start_study_run(params.tracking.experiment, PARAMS_FILE, "study"))
    args = ["exp", "run", *[a for o in overrides for a in ("-S", o)]] if overrides else ["repro"]
    return dvc(args, env)


@flow(name="retrain")
def retrain() -> dict:
    """Refresh the corpus, re-run what changed, compare the test perplexities with the last run; fail on regression."""
    params = load_params(PARAMS_FILE)
    before = json.loads(EVAL.read_text()) if EVAL.exists() else None
    env = _stage_env(tracking.start_study_run(params.tracking.experiment, PARAMS_FILE, "retrain"))
    # fetch the source again (a new dump, URL or sha256 gives new raw data); DVC's content hashes then
    # re-run only the stages whose inputs really changed
    dvc(["repro", "--force", "--single-item", "download"], env)
    log = dvc(["repro"], env)
    rows, regressed = compare_eval(before, json.loads(EVAL.read_text()), params.retrain.max_regression)
    report = comparison_markdown(rows, regressed, params.retrain.max_regression)
    create_markdown_artifact(report, key="retrain-comparison", description="test word perplexity, before vs after")
    get_run_logger().info("stages run: %s", [l for l in log.splitlines() if l.startswith("Running stage")])
    if regressed:
        raise LmpipeError(f"models regressed beyond retrain.max_regression={params.retrain.max_regression}: "
                          + ", ".join(regressed) + " (see the retrain-comparison artifact)")
    return {"rows": rows, "regressed": regressed}


if __name__ == "__main__":
    import sys

    main(retrain) if sys.argv[1:] == ["retrain"] else main(study, overrides=sys.argv[1:] or None)
