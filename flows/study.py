"""Flows that drive the whole pipeline: `study` (dvc repro / dvc exp run -S ...) and scheduled `retrain`.

Both create the study's MLflow parent run themselves and hand it to every stage (LMPIPE_PARENT_RUN_ID),
and point the stages at this flow's Prefect server (PREFECT_API_URL), so one execution is one study.

With `orchestration.task_runner: dask` (or `ray`) both flows run the independent train@<model> stages in parallel
on a Dask (Ray) cluster through Prefect's task runner: DVC runs the stages before them, the stale
train stages run as tasks (each its own stage process, as under DVC), `dvc commit` records them in
dvc.lock exactly as `dvc repro` would have, and `dvc repro` finishes the rest.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact

from flows._stage import PARAMS_FILE, main
from lmpipe import tracking
from lmpipe.compare import compare_eval, comparison_markdown
from lmpipe.config import OrchestrationParams, load_params
from lmpipe.errors import ConfigError, LmpipeError

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


@task(task_run_name="train@{model}")
def train_stage(model: str, cwd: str, env: dict) -> str:
    """One train@<model> stage's command, on whichever worker the task runner picked (cwd: the shared project)."""
    done = subprocess.run([sys.executable, "-m", "flows.train", "--model", model], cwd=cwd, env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise LmpipeError(f"train@{model} failed (exit {done.returncode}): "
                          + (done.stderr.strip().splitlines() or ["no output"])[-1])
    return model


def task_runner(settings: OrchestrationParams):
    """Prefect's task runner for the parallel training: a Dask or Ray cluster at `address`, else a local one."""
    if settings.task_runner == "dask":
        from prefect_dask import DaskTaskRunner

        if settings.address:
            return DaskTaskRunner(address=settings.address)
        return DaskTaskRunner(cluster_class="distributed.LocalCluster", cluster_kwargs={
            "n_workers": settings.workers, "threads_per_worker": 1, "processes": True,
            "host": "127.0.0.1", "dashboard_address": None})
    try:
        from prefect_ray import RayTaskRunner
    except ImportError:
        raise ConfigError("orchestration.task_runner 'ray' needs prefect-ray: pip install -c constraints.txt "
                          "-e '.[ray]' (or use 'dask')") from None
    if settings.address:
        return RayTaskRunner(address=settings.address)
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # local-only Ray: it stays on 127.0.0.1
    return RayTaskRunner(init_kwargs={"num_cpus": settings.workers, "include_dashboard": False})


def stages_before_training(dvc_yaml: str | Path = "dvc.yaml") -> list[str]:
    """The stages whose outputs the train stages read, from dvc.yaml (the graph is written there, not here)."""
    import yaml

    stages = yaml.safe_load(Path(dvc_yaml).read_text())["stages"]
    reads = set(stages["train"]["do"]["deps"])
    return [name for name, stage in stages.items()
            if any((out if isinstance(out, str) else next(iter(out))) in reads for out in stage.get("outs", []))]


def stale_train_stages(env: dict) -> list[str]:
    """The models whose train stage DVC would run now (once the stages before them are done)."""
    status = json.loads(dvc(["status", "--json", "dvc.yaml"], env) or "{}")
    return [name.split("@", 1)[1] for name in status if name.startswith("train@")]


@flow(name="train-models")
def train_models(models: list[str], env: dict) -> list[str]:
    """The stale train stages as parallel tasks (the flow's task runner decides where), then `dvc commit`."""
    futures = [train_stage.submit(model, os.getcwd(), env) for model in models]
    done = [future.result() for future in futures]
    dvc(["commit", "--force", *[f"train@{model}" for model in done]], env)
    return done


def repro(settings: OrchestrationParams, env: dict) -> str:
    """`dvc repro`, with the stale train stages run in parallel on the task runner when one is chosen."""
    if settings.task_runner == "sequential":
        return dvc(["repro"], env)
    log = dvc(["repro", *stages_before_training()], env)
    stale = stale_train_stages(env)
    if stale:
        workers = env if settings.address else {**env, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // settings.workers))}
        train_models.with_options(task_runner=task_runner(settings))(stale, workers)
    return log + dvc(["repro"], env)


@flow(name="study")
def study(overrides: list[str] | None = None) -> str:
    """Run the pipeline: `dvc repro`, or `dvc exp run -S ...` when overrides (e.g. models.lstm.epochs=4) are given."""
    params = load_params(PARAMS_FILE)
    settings = params.orchestration
    if overrides and settings.task_runner != "sequential":
        raise ConfigError(f"{PARAMS_FILE}: orchestration.task_runner {settings.task_runner!r} runs the study in the "
                          "workspace; set the values in params.yaml instead of passing overrides")
    if not overrides and not json.loads(dvc(["status", "--json", "dvc.yaml"], dict(os.environ)) or "{}"):
        print("Data and pipelines are up to date: no stage to run, no new study run")  # no empty parent in MLflow
        return ""
    env = _stage_env(tracking.start_study_run(params.tracking.experiment, PARAMS_FILE, "study"))
    if overrides:
        return dvc(["exp", "run", *[a for o in overrides for a in ("-S", o)]], env)
    return repro(settings, env)


@flow(name="retrain")
def retrain() -> dict:
    """Refresh the corpus, re-run what changed, compare the test perplexities with the last run; fail on regression."""
    params = load_params(PARAMS_FILE)
    before = json.loads(EVAL.read_text()) if EVAL.exists() else None
    env = _stage_env(tracking.start_study_run(params.tracking.experiment, PARAMS_FILE, "retrain"))
    # fetch the source again (a new dump, URL or sha256 gives new raw data); DVC's content hashes then
    # re-run only the stages whose inputs really changed
    dvc(["repro", "--force", "--single-item", "download"], env)
    log = repro(params.orchestration, env)
    rows, regressed = compare_eval(before, json.loads(EVAL.read_text()), params.retrain.max_regression)
    report = comparison_markdown(rows, regressed, params.retrain.max_regression)
    create_markdown_artifact(report, key="retrain-comparison", description="test word perplexity, before vs after")
    get_run_logger().info("stages run: %s", [l for l in log.splitlines() if l.startswith("Running stage")])
    if regressed:
        raise LmpipeError(f"models regressed beyond retrain.max_regression={params.retrain.max_regression}: "
                          + ", ".join(regressed) + " (see the retrain-comparison artifact)")
    return {"rows": rows, "regressed": regressed}


if __name__ == "__main__":
    main(retrain) if sys.argv[1:] == ["retrain"] else main(study, overrides=sys.argv[1:] or None)
