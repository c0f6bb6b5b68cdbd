"""The MLflow tracking store: where runs go (the project's SQLite store unless MLFLOW_TRACKING_URI says otherwise),
whether it answers, and keeping a copied checkout's store pointed at its own artifacts."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator

from mlflow.tracking import MlflowClient

from lmpipe.errors import TrackingError, first_line

# A server that answers /health but fails its API: a stage gives up within ~30 s, not after MLflow's 7 retries
HTTP_PATIENCE = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}


def project_root() -> Path:
    """DVC sets DVC_ROOT in every stage (also in `dvc exp run --temp` copies); else the working directory."""
    return Path(os.environ.get("DVC_ROOT") or os.getcwd()).resolve()


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{project_root() / 'mlflow.db'}"


@contextlib.contextmanager
def temporary_env(**values: str) -> Iterator[None]:
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


def prepare_store(timeout: float) -> None:
    """The tracking store ready for a stage, or a one-line failure: a server that does not answer within `timeout`
    seconds, or a SQLite path in a directory that does not exist. It writes to a SQLite store: a new one gets its
    schema (or an old one MLflow's migrations) under a file lock, so two pipelines starting at once on the same new
    store do not race, and a store copied from elsewhere has its artifact addresses moved here (`relocate_store`)."""
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
            with temporary_env(MLFLOW_HTTP_REQUEST_TIMEOUT=f"{max(1, round(timeout))}"):  # the probe only: uploads take longer
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


def artifact_location(uri: str) -> str | None:
    """Artifacts beside a SQLite store (mlartifacts/), so the store and its files travel together."""
    if uri.startswith("sqlite:///"):
        return (Path(uri.removeprefix("sqlite:///")).parent / "mlartifacts").as_uri()
    return None


