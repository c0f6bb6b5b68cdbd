"""The only module that talks to MLflow.

Every stage is one MLflow run under a parent "study" run. DVC runs each stage as its own process,
so the parent is found, not passed: the newest run tagged `lmpipe.role=study` with the same study
key (git commit + hash of params.yaml), created (and at once finished) when there is none.
`LMPIPE_PARENT_RUN_ID`, set by a flow that drives the whole pipeline, wins.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping

import mlflow
from mlflow.tracking import MlflowClient

from lmpipe.errors import TrackingError, first_line
from lmpipe.io import sha256_tree

ROLE, STUDY_KEY = "lmpipe.role", "lmpipe.study_key"
HOST, PID = "lmpipe.host", "lmpipe.pid"  # which process owns a RUNNING run
EXPERIMENT = "dvc.exp"  # on runs and model versions made by `dvc exp run`: the experiment's name (DVC_EXP_NAME)
# A server that answers /health but fails its API: a stage gives up within ~30 s, not after MLflow's 7 retries
HTTP_PATIENCE = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}


def experiment_tags() -> dict:
    """{dvc.exp: name} inside `dvc exp run`, else nothing: experiments stay apart from the study's own runs."""
    name = os.environ.get("DVC_EXP_NAME")
    return {EXPERIMENT: name} if name else {}


def project_root() -> Path:
    """DVC sets DVC_ROOT in every stage (also in `dvc exp run --temp` copies); else the working directory."""
    return Path(os.environ.get("DVC_ROOT") or os.getcwd()).resolve()


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{project_root() / 'mlflow.db'}"


@contextlib.contextmanager
def _env(**values: str) -> Iterator[None]:
    """Environment variables set for the duration of a block, then put back as they were."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def check_store(timeout: float) -> None:
    """Fail fast, in one line, when the tracking store is unusable: a server that does not answer within `timeout`
    seconds, or a SQLite path in a directory that does not exist. A new SQLite store gets its schema here, under a
    file lock, so two pipelines starting at once on the same new store do not race in MLflow's migrations."""
    import requests
    from filelock import FileLock

    uri = tracking_uri()
    if uri.startswith(("http://", "https://")):
        for name, value in HTTP_PATIENCE.items():  # the whole stage: a failing server is said within ~30 s
            os.environ.setdefault(name, value)
        try:
            requests.get(f"{uri.rstrip('/')}/health", timeout=timeout).raise_for_status()
        except requests.RequestException as exc:
            raise TrackingError(f"MLFLOW_TRACKING_URI={uri}: no MLflow server answered within {timeout:g} s "
                                f"({type(exc).__name__}); start the server, or unset MLFLOW_TRACKING_URI to use "
                                f"the project's mlflow.db") from None
        try:
            with _env(MLFLOW_HTTP_REQUEST_TIMEOUT=f"{max(1, round(timeout))}"):  # the probe only: uploads take longer
                MlflowClient(uri).search_experiments(max_results=1)
        except Exception as exc:
            first = first_line(str(exc)) or type(exc).__name__
            raise TrackingError(f"MLFLOW_TRACKING_URI={uri}: the MLflow server answers /health but its API fails "
                                f"({first}); check the server's log, or unset MLFLOW_TRACKING_URI to use the "
                                f"project's mlflow.db") from None
    elif uri.startswith("sqlite:///"):
        path = Path(uri.removeprefix("sqlite:///"))
        if not path.parent.is_dir():
            raise TrackingError(f"MLFLOW_TRACKING_URI={uri}: {path.parent} is not an existing directory "
                                f"(create it, or fix the URI)")
        with FileLock(f"{path}.lock", timeout=300):
            MlflowClient(uri).search_experiments(max_results=1)  # creates or migrates the schema, one process at a time
            relocate_store(path)


ARTIFACT_COLUMNS = (("experiments", "artifact_location"), ("runs", "artifact_uri"), ("model_versions", "source"),
                    ("model_versions", "storage_location"), ("logged_models", "artifact_location"))


def relocate_store(db: Path | None = None) -> str | None:
    """A checkout copied or moved elsewhere: MLflow records artifact addresses as absolute paths, so the store still
    points at the old mlartifacts/. Point every address under it at this checkout's (the project's own SQLite store
    only). Returns the old folder, or None when nothing had to move."""
    import sqlite3

    if db is None:
        uri = tracking_uri()
        if not uri.startswith("sqlite:///"):
            return None
        db = Path(uri.removeprefix("sqlite:///"))
    if not db.exists():
        return None
    with contextlib.closing(sqlite3.connect(db)) as con, con:
        tables = {row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "experiments" not in tables:
            return None
        old = next((location[:location.index("/mlartifacts") + len("/mlartifacts")]
                    for (location,) in con.execute("SELECT artifact_location FROM experiments")
                    if location and "/mlartifacts" in location and location.startswith(("file:///", "/"))), None)
        if old is None:
            return None
        folder = db.parent.resolve() / "mlartifacts"
        here = folder.as_uri() if old.startswith("file:") else str(folder)  # the address as MLflow wrote it
        if old == here:
            return None
        for table, column in ARTIFACT_COLUMNS:
            if table in tables:
                con.execute(f"UPDATE {table} SET {column} = ? || substr({column}, ?) WHERE substr({column}, 1, ?) = ?",
                            (here, len(old) + 1, len(old), old))
    return old


def _artifact_location(uri: str) -> str | None:
    """Artifacts beside a SQLite store (mlartifacts/), so the store and its files travel together."""
    if uri.startswith("sqlite:///"):
        return (Path(uri.removeprefix("sqlite:///")).parent / "mlartifacts").as_uri()
    return None


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


def experiment_id(name: str) -> str:
    """The experiment's id in this project's store (created when new). Points the mlflow module at that store:
    every run this module starts or finds goes there."""
    uri = tracking_uri()
    mlflow.set_tracking_uri(uri)
    experiment = mlflow.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    return mlflow.create_experiment(name, artifact_location=_artifact_location(uri))


def _new_study_run(experiment: str, key: StudyKey, driver: str | None = None) -> str:
    """A finished parent run for one study; its stages nest under it as they run."""
    tags = {ROLE: "study", STUDY_KEY: str(key), "mlflow.source.git.commit": key.commit,
            **({"lmpipe.driver": driver} if driver else {})}
    exp_id = experiment_id(experiment)  # first: it points the client at this project's store
    client = MlflowClient()
    run = client.create_run(exp_id, run_name=f"{driver or 'study'} {key.commit[:8]}", tags=tags)
    client.set_terminated(run.info.run_id, "FINISHED")
    return run.info.run_id


def study_run_id(experiment: str, key: StudyKey) -> str:
    """The parent run of this study: from LMPIPE_PARENT_RUN_ID, else found by key, else created finished."""
    if os.environ.get("LMPIPE_PARENT_RUN_ID"):
        return os.environ["LMPIPE_PARENT_RUN_ID"]
    exp_id = experiment_id(experiment)  # first: it points the client at this project's store
    found = MlflowClient().search_runs(
        [exp_id],
        filter_string=f"tags.`{ROLE}` = 'study' and tags.`{STUDY_KEY}` = '{key}'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    return found[0].info.run_id if found else _new_study_run(experiment, key)


def end_study_run(run_id: str, status: str | None = None) -> None:
    """Mark a study's parent run ended now (it is created ended, at its first stage): its duration is the study's.
    `status` (FAILED, KILLED) replaces its FINISHED where the study did not finish."""
    import time

    client = MlflowClient()
    client.set_terminated(run_id, status or client.get_run(run_id).info.status, end_time=int(time.time() * 1000))


def start_study_run(experiment: str, params_file: str | Path = "params.yaml", name: str = "study") -> str:
    """A new parent run for a pipeline execution driven by a flow; its id goes to the stages in LMPIPE_PARENT_RUN_ID."""
    return _new_study_run(experiment, study_key(params_file), driver=name)


def flatten(tree: Mapping, prefix: str = "") -> dict:
    """{'a': {'b': 1}} -> {'a.b': 1}: MLflow keys for nested params and metrics."""
    flat = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


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
    """mlflow.start_run that never leaves a ghost: an interrupt ends the run KILLED (an error: FAILED), and runs
    left RUNNING by processes of this host that died without a word (SIGKILL, power) are ended FAILED first."""
    exp_id = experiment_id(experiment)
    _end_ghosts(exp_id)
    tags = {**start.pop("tags", {}), HOST: socket.gethostname(), PID: str(os.getpid())}
    with mlflow.start_run(experiment_id=exp_id, tags=tags, **start) as active:
        try:
            yield active
        except KeyboardInterrupt:
            mlflow.end_run("KILLED")
            raise


def end_ghost_runs(experiment: str) -> list[str]:
    """End FAILED the RUNNING runs started on this host by a process that no longer exists; their ids."""
    return _end_ghosts(experiment_id(experiment))  # experiment_id first: it points mlflow at this process's store


def _end_ghosts(exp_id: str) -> list[str]:
    client = MlflowClient(tracking_uri())
    running = client.search_runs([exp_id], f"attributes.status = 'RUNNING' and tags.`{HOST}` = "
                                 f"'{socket.gethostname()}'", max_results=1000)
    ghosts = [r.info.run_id for r in running if not process_alive(int(r.data.tags.get(PID, 0)))]
    for run_id in ghosts:
        client.set_tag(run_id, "lmpipe.ended", "its process died; ended by the next stage")
        client.set_terminated(run_id, "FAILED")
    return ghosts


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
    exp_id = experiment_id(experiment)
    return MlflowClient().search_runs([exp_id], " and ".join(f"tags.`{k}` = '{v}'" for k, v in tags.items()),
                                      order_by=["attributes.start_time DESC"], max_results=1000)


def log_metrics(metrics: Mapping, step: int | None = None, run_id: str | None = None) -> None:
    """Log every numeric leaf of a (nested) metrics dict; strings and lists are left to artifacts."""
    numeric = {k: float(v) for k, v in flatten(metrics).items()
               if isinstance(v, (int, float)) and not isinstance(v, bool)}
    mlflow.log_metrics(numeric, step=step, run_id=run_id)


def log_compare_axes(model: str, n_params: float, train_tokens: float) -> None:
    """Params that put size and data first in MLflow's compare view.

    Its parallel-coordinates plot opens on the first three params (sorted by name) that differ between the
    runs: `compute.params_m`, `compute.tokens_m` and `lm` sort before every `model.*`/`ngram.*` setting.
    """
    mlflow.log_params({"compute.params_m": round(n_params / 1e6, 3), "compute.tokens_m": round(train_tokens / 1e6, 3),
                       "lm": model})


def log_evaluation(record: Mapping, run_id: str) -> None:
    """One learning-curve point (a Trainer `on_eval` record) as step metrics of a training run."""
    log_metrics({k: v for k, v in record.items() if k != "step"}, step=record["step"], run_id=run_id)


# all an lmpipe LM's pyfunc models import besides lmpipe's own code, which goes with them
MODEL_REQUIREMENTS = ("mlflow", "torch", "numpy", "pandas", "tokenizers", "pydantic", "pyyaml")


def pinned_requirements(names=MODEL_REQUIREMENTS, lock_file: str | Path = "constraints.txt") -> list[str]:
    """The lock file's pins of `names` (inferring requirements is slow and lists far more); bare names without it."""
    path = project_root() / lock_file
    lines = path.read_text().splitlines() if path.exists() else []
    pins = {line.split("==")[0].strip().lower(): line.strip() for line in lines if "==" in line and not line.startswith("#")}
    return [pins.get(name, name) for name in names]


def log_lm(model_dir: str | Path, tokenizer: str | Path, registered_name: str, vocab_size: int) -> None:
    """Log a trained LM as two pyfunc models of the active run (lmpipe.serving): `model`, prompts in and text out,
    registered as `registered_name` (so `mlflow models serve -m models:/<name>@champion` answers prompts), and
    `logits`, token ids in and next-token logits out. Both carry the model's files (a state dict and JSON), the
    tokenizer and lmpipe's code, and are logged as code: loading them unpickles nothing."""
    import tempfile

    import mlflow.pyfunc
    import numpy as np
    import pandas as pd

    from lmpipe import serving
    from lmpipe.decode import DecodeSettings

    here, defaults = Path(__file__).parent, DecodeSettings()
    signatures = serving.signatures(vocab_size, defaults)
    with tempfile.TemporaryDirectory() as scratch:
        common = {"artifacts": serving.bundle_files(model_dir, tokenizer, defaults, Path(scratch)),
                  "code_paths": [str(here)], "pip_requirements": pinned_requirements()}
        mlflow.pyfunc.log_model(name="logits", python_model=str(here / "pyfunc/logits.py"), **common,
                                signature=signatures["logits"], input_example=np.zeros((1, 2), dtype=np.int64))
        info = mlflow.pyfunc.log_model(name="model", python_model=str(here / "pyfunc/text.py"), **common,
                                       signature=signatures["text"], registered_model_name=registered_name,
                                       input_example=(pd.DataFrame({"prompt": ["The history of"]}),
                                                      {"max_new_tokens": 8}))
    client, version = MlflowClient(), str(info.registered_model_version)
    for key, value in experiment_tags().items():  # a `dvc exp run` version is not one of the study's
        client.set_model_version_tag(registered_name, version, key, value)
    name_aliases(client, registered_name, version)


def registered_version(uri: str):
    """The ModelVersion a `models:/<name>/<version>` or `models:/<name>@<alias>` URI names."""
    client, ref = MlflowClient(), uri.removeprefix("models:/")
    if "@" in ref:
        return client.get_model_version_by_alias(*ref.split("@", 1))
    name, _, version = ref.rpartition("/")
    if version == "latest":
        found = client.search_model_versions(f"name = '{name}'")
        if found:
            return max(found, key=lambda v: int(v.version))
    return client.get_model_version(name, version)


def registered_artifacts(uri: str) -> dict[str, Path]:
    """A registered model's artifacts (e.g. models:/lmpipe-gru@champion), downloaded and named as it names them;
    nothing of it is imported or unpickled. A version the registry lacks and a version whose files are gone are
    told apart."""
    import yaml
    from mlflow.exceptions import MlflowException

    mlflow.set_tracking_uri(tracking_uri())
    relocate_store()
    try:
        version = registered_version(uri)
    except MlflowException as exc:
        raise TrackingError(f"{uri}: not in the MLflow model registry at {tracking_uri()} ({exc.error_code}; see the "
                            "versions with `lmpipe ui`, Models)") from None
    try:
        with _env(MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR=str(sys.stderr.isatty()).lower()):  # a bar for a person only
            local = Path(mlflow.artifacts.download_artifacts(artifact_uri=uri))
        spec = yaml.safe_load((local / "MLmodel").read_text()).get("flavors", {}).get("python_function", {})
    except (MlflowException, OSError) as exc:
        raise TrackingError(f"{uri}: version {version.version} is registered, but its files are missing "
                            f"({type(exc).__name__}) under {version.source}: was mlartifacts/ removed?") from None
    if "artifacts" not in spec:
        raise TrackingError(f"{uri}: not an lmpipe text model (no artifacts in its MLmodel); register it anew by "
                            "re-training: dvc repro --force train@<model>")
    return {name: local / artifact["path"] for name, artifact in spec["artifacts"].items()}


CHAMPION, CHALLENGER = "champion", "challenger"


def name_aliases(client: MlflowClient, registered_name: str, version: str) -> None:
    """Every new version is the `challenger`; the first of the study's own becomes the `champion`, which after that
    only a passing retrain moves (`promote_experiment`). Users load `models:/<name>@champion` (MLflow aliases
    replaced stages in 2.9)."""
    from mlflow.exceptions import MlflowException

    client.set_registered_model_alias(registered_name, CHALLENGER, version)
    if experiment_tags():
        return
    try:
        client.get_model_version_by_alias(registered_name, CHAMPION)
    except MlflowException:
        client.set_registered_model_alias(registered_name, CHAMPION, version)


@contextlib.contextmanager
def _quiet(logger: str, text: str) -> Iterator[None]:
    """Drop one known, already-answered warning of a library logger for the duration of a call."""
    import logging

    class Drop(logging.Filter):
        def filter(self, record):
            return text not in record.getMessage()

    drop = Drop()
    logging.getLogger(logger).addFilter(drop)
    try:
        yield
    finally:
        logging.getLogger(logger).removeFilter(drop)


def log_dict(obj, artifact_file: str) -> None:
    mlflow.log_dict(obj, artifact_file)


def log_artifacts(path: str | Path, artifact_path: str | None = None, run_id: str | None = None) -> None:
    """Log a file, or a directory's contents, under `artifact_path` of the active run (or of `run_id`)."""
    path = Path(path)
    if run_id is None:
        (mlflow.log_artifacts if path.is_dir() else mlflow.log_artifact)(str(path), artifact_path)
    else:
        client = MlflowClient()
        (client.log_artifacts if path.is_dir() else client.log_artifact)(run_id, str(path), artifact_path)


OUTPUT = "lmpipe.output_sha256"
NOTE = "mlflow.note.content"  # a run's description in the MLflow UI


def output_hash(paths: str | Path | list) -> str:
    """The content hash a run is tagged with: of one file or folder, or of several (their paths and hashes, in order)."""
    if isinstance(paths, (str, Path)):
        return sha256_tree(paths)
    listed = "".join(f"{Path(p).as_posix()}\0{sha256_tree(p)}\n" for p in paths)
    return hashlib.sha256(listed.encode()).hexdigest()


def mark_output(paths: str | Path | list, run_id: str | None = None) -> None:
    """Tag the run that produced `paths` (a model folder, or a stage's outputs) with their content hash. Later stages
    find the run from the output itself (`run_of_output`), so no run id is stored inside a DVC output: an identical
    re-run writes identical files and leaves the stages downstream up to date."""
    MlflowClient().set_tag(run_id or mlflow.active_run().info.run_id, OUTPUT, output_hash(paths))


def run_of_output(experiment: str, paths: str | Path | list) -> str | None:
    """The newest run that produced exactly the files now at `paths` (None when no run did: a hand-made model)."""
    exp_id = experiment_id(experiment)  # first: it points the client at this project's store
    found = MlflowClient().search_runs([exp_id], f"tags.`{OUTPUT}` = '{output_hash(paths)}'",
                                       order_by=["attributes.start_time DESC"], max_results=1)
    return found[0].info.run_id if found else None


def carry_results(experiment: str, path: str | Path, run_id: str) -> None:
    """Give `run_id` the test metrics and description of the newest evaluated run that made the same files at `path`.
    A retrain that reproduces a model bit for bit leaves DVC nothing to re-evaluate; its run still shows the results."""
    exp_id = experiment_id(experiment)  # first: it points the client at this project's store
    client = MlflowClient()
    found = client.search_runs([exp_id], f"tags.`{OUTPUT}` = '{sha256_tree(path)}' and metrics.test_bpb > 0",
                               order_by=["attributes.start_time DESC"], max_results=2)
    earlier = next((r for r in found if r.info.run_id != run_id), None)
    if earlier is None:
        return
    log_metrics({k: v for k, v in earlier.data.metrics.items() if k.startswith("test_")}, run_id=run_id)
    if NOTE in earlier.data.tags:
        client.set_tag(run_id, NOTE, earlier.data.tags[NOTE])


def parent_run_id(run) -> str | None:
    """The study run a stage run is nested under."""
    return MlflowClient().get_run(run.info.run_id).data.tags.get("mlflow.parentRunId")


def champion_versions(models) -> dict:
    """{model: its champion ModelVersion}, for the models that have one (the n-gram is never registered)."""
    from mlflow.exceptions import MlflowException

    client, found = MlflowClient(), {}
    for model in models:
        with contextlib.suppress(MlflowException):
            found[model] = client.get_model_version_by_alias(f"lmpipe-{model}", CHAMPION)
    return found


def champion_metrics(models) -> dict[str, dict]:
    """{model: {version, word_ppl, bpb}}: each champion's test metrics, from its run (the retrain gate's baseline)."""
    client, found = MlflowClient(), {}
    for model, version in champion_versions(models).items():
        metrics = client.get_run(version.run_id).data.metrics
        if {"test_word_ppl", "test_bpb"} <= set(metrics):
            found[model] = {"version": str(version.version), "word_ppl": metrics["test_word_ppl"],
                            "bpb": metrics["test_bpb"]}
    return found


def promote_experiment(name: str) -> dict[str, str]:
    """A passing retrain: the versions its experiment registered become the champions. {registered name: version}."""
    client, moved = MlflowClient(), {}
    for version in client.search_model_versions(f"tags.`{EXPERIMENT}` = '{name}'"):
        client.set_registered_model_alias(version.name, CHAMPION, str(version.version))
        moved[version.name] = str(version.version)
    return moved


def set_tags(run_id: str, tags: Mapping[str, str]) -> None:
    client = MlflowClient()
    for key, value in tags.items():
        client.set_tag(run_id, key, value)
