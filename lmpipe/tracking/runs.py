"""The runs of a study in MLflow: one parent "study" run, one run per stage execution under it, and side runs
(sweeps, the scaling grid, the seeds). Each process ends only its own runs; those a process left RUNNING when it
died without a word (SIGKILL) are ended by the next study's driver (`end_ghost_runs`), never by another stage.

DVC runs each stage as its own process, so the parent is found, not passed: the newest run tagged
`lmpipe.role=study` with the same study key (git commit + hash of params.yaml), created (and at once finished) when
there is none. `LMPIPE_PARENT_RUN_ID`, set by a flow that drives the whole pipeline, wins.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping

import mlflow

from lmpipe.errors import first_few
from lmpipe.tracking.store import project_root
from lmpipe.tracking import experiment_tags, flatten, tracker

ROLE, STUDY_KEY = "lmpipe.role", "lmpipe.study_key"
HOST, PID = "lmpipe.host", "lmpipe.pid"  # which process owns a RUNNING run


def git_commit(root: Path | None = None) -> str:
    from lmpipe.git import git_or_empty  # here: the commit only tags runs, so no stage depends on lmpipe/git.py for it

    return git_or_empty("rev-parse", "HEAD", cwd=root or project_root()) or "unknown"


@dataclass(frozen=True)
class StudyKey:
    """What makes one study: the code (git commit) and the settings (a hash of params.yaml)."""

    commit: str
    params_digest: str

    def __str__(self) -> str:  # the tag value on MLflow runs and Prefect flow runs
        return f"{self.commit}:{self.params_digest}"


def study_key(params_file: str | Path = "params.yaml") -> StudyKey:
    return StudyKey(git_commit(), hashlib.sha256(Path(params_file).read_bytes()).hexdigest()[:12])


def _new_study_run(experiment: str, key: StudyKey, driver: str | None = None) -> str:
    """A finished parent run for one study; its stages nest under it as they run."""
    tags = {ROLE: "study", STUDY_KEY: str(key), "mlflow.source.git.commit": key.commit,
            **({"lmpipe.driver": driver} if driver else {})}
    t = tracker()
    run = t.client.create_run(t.experiment_id(experiment), run_name=f"{driver or 'study'} {key.commit[:8]}", tags=tags)
    t.client.set_terminated(run.info.run_id, "FINISHED")
    return run.info.run_id


def study_run_id(experiment: str, key: StudyKey) -> str:
    """The parent run of this study: from LMPIPE_PARENT_RUN_ID, else found by key, else created finished."""
    if os.environ.get("LMPIPE_PARENT_RUN_ID"):
        return os.environ["LMPIPE_PARENT_RUN_ID"]
    found = tracker().find_runs(experiment, f"tags.`{ROLE}` = 'study' and tags.`{STUDY_KEY}` = '{key}'", newest=1)
    return found[0].info.run_id if found else _new_study_run(experiment, key)


def end_study_run(run_id: str, status: str | None = None) -> None:
    """Mark a study's parent run ended now (it is created ended, at its first stage): its duration is the study's.
    `status` (FAILED, KILLED) replaces its FINISHED where the study did not finish."""
    import time

    client = tracker().client
    client.set_terminated(run_id, status or client.get_run(run_id).info.status, end_time=int(time.time() * 1000))


def start_study_run(experiment: str, params_file: str | Path = "params.yaml", name: str = "study") -> str:
    """A new parent run for a pipeline execution driven by a flow; its id goes to the stages in LMPIPE_PARENT_RUN_ID."""
    return _new_study_run(experiment, study_key(params_file), driver=name)


@contextlib.contextmanager
def open_stage_run(
    stage: str,
    experiment: str,
    params: Mapping,
    params_hash: str,
    *,
    model: str | None = None,
    tags: Mapping[str, str] | None = None,
    params_file: str | Path = "params.yaml",
) -> Iterator[mlflow.ActiveRun]:
    """One MLflow run for one stage execution, nested under the study run, with its params logged."""
    key = study_key(params_file)
    parent = study_run_id(experiment, key)
    run_tags = {
        ROLE: "stage",
        "lmpipe.stage": stage,
        "lmpipe.params_hash": params_hash,
        "lmpipe.git_commit": key.commit,
        "mlflow.source.git.commit": key.commit,
        STUDY_KEY: str(key),
        **({"lmpipe.model": model} if model else {}),
        **experiment_tags(),
        **(tags or {}),
    }
    training = stage.startswith("train@")  # CPU and memory every 10 s beside the learning curve (system/* metrics)
    if training:
        import logging

        logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)  # its start/stop lines, 4 per stage
    with _closing(experiment, run_name=stage, parent_run_id=parent, tags=run_tags, log_system_metrics=training) as run:
        flat = {k: ("null" if v is None else v) for k, v in flatten(params).items()}
        mlflow.log_params(flat)
        yield run


@contextlib.contextmanager
def _closing(experiment: str, **start) -> Iterator[mlflow.ActiveRun]:
    """mlflow.start_run that ends its run on every way out: an interrupt ends it KILLED (an error: FAILED). It touches
    no other run; it tags its own with this host and process, so that a driver can tell a dead process's run."""
    exp_id = tracker().experiment_id(experiment)
    tags = {**start.pop("tags", {}), HOST: socket.gethostname(), PID: str(os.getpid())}
    with mlflow.start_run(experiment_id=exp_id, tags=tags, **start) as active:
        try:
            yield active
        except KeyboardInterrupt:
            mlflow.end_run("KILLED")
            raise


def end_ghost_runs(experiment: str, driver: str) -> str | None:
    """End FAILED the RUNNING runs started on this host by a process that no longer exists (killed without a word:
    SIGKILL, power); a line naming them, None when there were none. The one step that touches runs of other
    processes: the drivers of a whole study (`make study`, `lmpipe retrain`, the study flow) take it before their
    first stage starts."""
    t = tracker()
    running = t.client.search_runs([t.experiment_id(experiment)], f"attributes.status = 'RUNNING' and "
                                   f"tags.`{HOST}` = '{socket.gethostname()}'", max_results=1000)
    ghosts = [r for r in running if not process_alive(int(r.data.tags.get(PID, 0)))]
    for run in ghosts:
        t.client.set_tag(run.info.run_id, "lmpipe.ended", f"its process died; ended by {driver}")
        t.client.set_terminated(run.info.run_id, "FAILED")
    if not ghosts:
        return None
    names = [run.info.run_name for run in ghosts]
    return f"ended FAILED {len(names)} MLflow run(s) left RUNNING by a process that died: {first_few(names, 3)}"


def process_alive(pid: int) -> bool:
    """Whether process `pid` runs on this host (0 and negative ids name process groups: never a live holder)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


@contextlib.contextmanager
def run(experiment: str, name: str, params: Mapping | None = None, tags: Mapping[str, str] | None = None,
        parent_run_id: str | None = None, resume: Mapping[str, str] | None = None) -> Iterator[mlflow.ActiveRun]:
    """A run outside the stage graph (a sweep, one of its trials), optionally nested under `parent_run_id`.

    `resume` ({tag: value}): continue the newest run carrying that tag (an interrupted grid) instead of a new one."""
    found = find_runs(experiment, resume) if resume else []
    with _closing(experiment, run_name=name, parent_run_id=parent_run_id, nested=parent_run_id is not None,
                  tags={**(tags or {}), **(resume or {})},
                  **({"run_id": found[0].info.run_id} if found else {})) as active:
        if params:
            mlflow.log_params({k: ("null" if v is None else v) for k, v in flatten(params).items()})
        yield active


def find_runs(experiment: str, tags: Mapping[str, str]) -> list:
    """The runs carrying all these tag values, newest first."""
    return tracker().find_runs(experiment, " and ".join(f"tags.`{k}` = '{v}'" for k, v in tags.items()))


def parent_run_id(run) -> str | None:
    """The study run a stage run is nested under."""
    return tracker().client.get_run(run.info.run_id).data.tags.get("mlflow.parentRunId")
