"""The project's MLflow client: every run, metric, tag and registry entry a stage writes goes through it (the
served model's classes, lmpipe/serving.py and lmpipe/pyfunc/, are MLflow's model format, not its store). Here: one
store as an object, and what every run logs to it.

`Tracker(uri)` owns the store's client; making one is the one place the mlflow module (its fluent API: start_run,
log_metrics) is pointed at a store. `tracker()` is the store this process tracks to now (MLFLOW_TRACKING_URI, else
the project's mlflow.db). Beside it: `store` (where runs go, whether the store answers), `runs` (the study, stage
and side runs) and `registry` (the registered models and their aliases).

A run is found from what it made: its outputs' content hash is a tag (`mark_output`, `run_of_output`), so no run id
is stored inside a DVC output and an identical re-run leaves the stages downstream up to date.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Mapping

import mlflow
from mlflow.tracking import MlflowClient

from lmpipe.io import sha256_tree
from lmpipe.tracking.store import artifact_location, tracking_uri

EXPERIMENT = "dvc.exp"  # on runs and model versions made by `dvc exp run`: the experiment's name (DVC_EXP_NAME)
OUTPUT = "lmpipe.output_sha256"
NOTE = "mlflow.note.content"  # a run's description in the MLflow UI


class Tracker:
    """A tracking store and its client. Made, it points the mlflow module's fluent API at this store too."""

    def __init__(self, uri: str):
        self.uri = uri
        self.client = MlflowClient(uri)
        mlflow.set_tracking_uri(uri)

    def experiment_id(self, name: str) -> str:
        """The experiment's id (created when new, its artifacts beside a SQLite store)."""
        experiment = self.client.get_experiment_by_name(name)
        if experiment is not None:
            return experiment.experiment_id
        return self.client.create_experiment(name, artifact_location=artifact_location(self.uri))

    def find_runs(self, experiment: str, where: str, newest: int = 1000) -> list:
        """The runs of `experiment` (a name) matching the filter `where`, newest first."""
        return self.runs_in(self.experiment_id(experiment), where, newest)

    def runs_in(self, experiment_id: str, where: str, newest: int = 1000) -> list:
        """The runs of the experiment `experiment_id` matching the filter `where`, newest first."""
        return self.client.search_runs([experiment_id], where, order_by=["attributes.start_time DESC"],
                                       max_results=newest)


_current: Tracker | None = None


def tracker() -> Tracker:
    """The store this process tracks to now; a new Tracker when MLFLOW_TRACKING_URI, or the mlflow module's store
    (another library may point it elsewhere), has changed since the last."""
    global _current
    uri = tracking_uri()
    if _current is None or _current.uri != uri or mlflow.get_tracking_uri() != uri:
        _current = Tracker(uri)
    return _current


def experiment_tags() -> dict:
    """{dvc.exp: name} inside `dvc exp run`, else nothing: experiments stay apart from the study's own runs."""
    name = os.environ.get("DVC_EXP_NAME")
    return {EXPERIMENT: name} if name else {}


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


def log_metrics(metrics: Mapping, step: int | None = None, run_id: str | None = None) -> None:
    """Log every numeric leaf of a (nested) metrics dict to the active run (or `run_id`); strings and lists are
    left to artifacts."""
    numeric = {k: float(v) for k, v in flatten(metrics).items()
               if isinstance(v, (int, float)) and not isinstance(v, bool)}
    tracker()
    mlflow.log_metrics(numeric, step=step, run_id=run_id)


def log_evaluation(record: Mapping, run_id: str) -> None:
    """One learning-curve point (a Trainer `on_eval` record) as step metrics of a training run."""
    log_metrics({k: v for k, v in record.items() if k != "step"}, step=record["step"], run_id=run_id)


def log_compare_axes(model: str, n_params: float, train_tokens: float, run_id: str | None = None) -> None:
    """Params that put size and data first in MLflow's compare view.

    Its parallel-coordinates plot opens on the first three params (sorted by name) that differ between the
    runs: `compute.params_m`, `compute.tokens_m` and `lm` sort before every `model.*`/`ngram.*` setting.
    """
    tracker()
    mlflow.log_params({"compute.params_m": round(n_params / 1e6, 3), "compute.tokens_m": round(train_tokens / 1e6, 3),
                       "lm": model}, run_id=run_id)


def record_training(run_id: str, metrics: Mapping, curve: str | Path | None = None,
                    model_dir: str | Path | None = None) -> None:
    """All a finished training run records on its MLflow run: its summary metrics (FLOPs in TFLOPs too, readable in
    the UI), the compare view's axes, its curve file, and for a model folder the folder's content hash (score,
    evaluate and audit find the run from the files) and the test results of an earlier run that made the same files
    (`carry_results`)."""
    log_metrics({**metrics, "train_tflops": metrics["train_flops"] / 1e12}, run_id=run_id)
    log_compare_axes(metrics["model"], metrics["n_params"], metrics["tokens_seen"], run_id=run_id)
    if curve is not None:
        log_artifacts(curve, run_id=run_id)
    if model_dir is not None:
        mark_output(model_dir, run_id)
        carry_results(model_dir, run_id)


def log_artifacts(path: str | Path, artifact_path: str | None = None, run_id: str | None = None) -> None:
    """Log a file, or a directory's contents, under `artifact_path` of the active run (or of `run_id`)."""
    path, client = Path(path), tracker().client
    run_id = run_id or mlflow.active_run().info.run_id
    (client.log_artifacts if path.is_dir() else client.log_artifact)(run_id, str(path), artifact_path)


def set_tags(run_id: str, tags: Mapping[str, str]) -> None:
    client = tracker().client
    for key, value in tags.items():
        client.set_tag(run_id, key, value)


def output_hash(paths: str | Path | list) -> str:
    """The content hash a run is tagged with: of one file or folder, or of several (their paths and hashes, in order)."""
    if isinstance(paths, (str, Path)):
        return sha256_tree(paths)
    listed = "".join(f"{Path(p).as_posix()}\0{sha256_tree(p)}\n" for p in paths)
    return hashlib.sha256(listed.encode()).hexdigest()


def mark_output(paths: str | Path | list, run_id: str | None = None) -> None:
    """Tag the run that produced `paths` (a model folder, or a stage's outputs) with their content hash. Later stages
    find the run from the output itself (`run_of_output`)."""
    tracker().client.set_tag(run_id or mlflow.active_run().info.run_id, OUTPUT, output_hash(paths))


def run_of_output(experiment: str, paths: str | Path | list) -> str | None:
    """The newest run that produced exactly the files now at `paths` (None when no run did: a hand-made model)."""
    found = tracker().find_runs(experiment, f"tags.`{OUTPUT}` = '{output_hash(paths)}'", newest=1)
    return found[0].info.run_id if found else None


# The MLflow views' columns, "vs <baseline>" second: the answer first, so that at 1400 px with MLflow's Assistant panel
# open (it leaves room for two) test bpb and the gap to the baseline are in view, word ppl next, the cost last.
LABELS = ("test bpb", "word ppl", "size", "training FLOPs")


def record_results(run_id: str, test: Mapping) -> None:
    """A model's test metrics (as `test_<key>`) on the run that trained it, the one way they get there. Its writers:
    the score stage, and `carry_results` (a retrain that made the same files)."""
    log_metrics({f"test_{k}": v for k, v in test.items()}, run_id=run_id)


def carry_results(path: str | Path, run_id: str) -> None:
    """Give `run_id` the test metrics of the newest scored run of its experiment that made the same files at `path`.
    A retrain that reproduces a model bit for bit leaves DVC nothing to score again; its run still shows the results."""
    tracked = tracker()
    found = tracked.runs_in(tracked.client.get_run(run_id).info.experiment_id,
                            f"tags.`{OUTPUT}` = '{sha256_tree(path)}' and metrics.test_bpb > 0", newest=2)
    earlier = next((r for r in found if r.info.run_id != run_id), None)
    if earlier is None:
        return
    record_results(run_id, {k.removeprefix("test_"): v for k, v in earlier.data.metrics.items() if k.startswith("test_")})


from lmpipe.tracking import registry, runs, store  # noqa: E402, F401  (they build on the Tracker above)
