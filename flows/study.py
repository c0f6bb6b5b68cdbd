"""The flow that drives the whole pipeline: `study` (dvc repro / dvc exp run -S ...); lmpipe_cli/retrain.py builds on it.

It creates the study's MLflow parent run itself and hands it to every stage (LMPIPE_PARENT_RUN_ID),
and points the stages at this flow's Prefect server (PREFECT_API_URL), so one execution is one study.

With `orchestration.task_runner: dask` (or `ray`) it runs the independent train@<model> stages in parallel
on a Dask (Ray) cluster through Prefect's task runner: DVC runs the stages before them, the stale
train stages run as tasks (each its own stage process, as under DVC), `dvc commit` records them in
dvc.lock exactly as `dvc repro` would have, and `dvc repro` finishes the rest.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

from prefect import flow, task

from flows._stage import PARAMS_FILE, main, settings_argv
from flows.runners import task_runner
from lmpipe import dvc_files, paths, tracking
from lmpipe.config import OrchestrationParams, load_params
from lmpipe.overrides import check_overrides
from lmpipe.errors import ConfigError, LmpipeError

def stage_env(parent_run_id: str) -> dict:
    from prefect.settings import PREFECT_API_URL

    env = {**os.environ, "LMPIPE_PARENT_RUN_ID": parent_run_id}
    if PREFECT_API_URL.value():
        env["PREFECT_API_URL"] = PREFECT_API_URL.value()
    return env


STUDY_LOCK = Path(paths.CACHE) / "study.lock"  # held (flock) by the running study or retrain: its pid inside


def dvc_lock_holder(root: Path = Path(".")) -> str | None:
    """'pid N (command)' of a live process holding DVC's lock on this project (.dvc/tmp/rwlock), else None."""
    try:
        info = json.loads((root / ".dvc/tmp/rwlock").read_text())
    except (OSError, ValueError):
        return None
    holders = list(info.get("write", {}).values()) + [h for hs in info.get("read", {}).values() for h in hs]
    for holder in holders:
        if isinstance(holder, dict) and tracking.runs.process_alive(int(holder.get("pid", 0))):
            return f"pid {holder['pid']} ({holder.get('cmd', 'dvc')})"
    return None


@contextlib.contextmanager
def one_study(lock: Path = STUDY_LOCK):
    """One study or retrain at a time in a project: a second says who runs and waits for nothing."""
    import fcntl

    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            pid = handle.read().strip() or "unknown"
            raise LmpipeError(f"another study is running in this project (pid {pid}); wait for it to finish "
                              "(its locks are live: remove none of them)") from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        try:
            yield
        finally:
            handle.seek(0)
            handle.truncate()
            fcntl.flock(handle, fcntl.LOCK_UN)


@task
def dvc(args: list[str], env: dict) -> str:
    done = subprocess.run(["dvc", *args], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        busy = any(words in done.stderr for words in ("is busy, it is being blocked by", "Unable to acquire lock"))
        holder = dvc_lock_holder() if busy else None
        if holder:  # DVC's own last line invites removing the lock of a live run
            raise LmpipeError(f"dvc {' '.join(args)}: another DVC command is running in this project, {holder}; "
                              "wait for it to finish (its lock is live: do not remove it)")
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


def stages_before_training(dvc_yaml: str | Path = "dvc.yaml") -> list[str]:
    """The stages whose outputs the train stages read, from dvc.yaml (the graph is written there, not here)."""
    stages = dvc_files.pipeline_stages(dvc_yaml)
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
    """Run the pipeline: `dvc repro`, or `dvc exp run -S ...` when overrides (e.g. models.lstm.optim.lr=0.006) are given."""
    params = load_params(PARAMS_FILE)
    settings = params.orchestration
    if overrides and settings.task_runner != "sequential":
        raise ConfigError(f"{PARAMS_FILE}: orchestration.task_runner {settings.task_runner!r} runs the study in the "
                          "workspace; set the values in params.yaml instead of passing overrides")
    check_overrides(PARAMS_FILE, overrides)  # a typo in an override stops here, before DVC runs any stage
    with one_study():
        if said := tracking.runs.end_ghost_runs(params.tracking.experiment, "the study flow"):
            print(said, flush=True)
        if not overrides and not json.loads(dvc(["status", "--json", "dvc.yaml"], dict(os.environ)) or "{}"):
            print("Data and pipelines are up to date: no stage to run, no new study run")  # no empty parent in MLflow
            return ""
        env = stage_env(tracking.runs.start_study_run(params.tracking.experiment, PARAMS_FILE, "study"))
        if overrides:
            return dvc(["exp", "run", *[a for o in overrides for a in ("-S", o)]], env)
        return repro(settings, env)


if __name__ == "__main__":
    main(study, overrides=settings_argv("a setting, as dvc exp run -S takes it"))
