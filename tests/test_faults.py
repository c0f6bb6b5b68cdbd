"""Faults a user meets, injected on purpose: each must end in one clear line, or be survived, never a silent wrong result.

(Kill-and-resume with identical curves, changed data never resuming and unreadable checkpoints are in test_train.py;
a wrong corpus sha256 in test_corpus.py and test_download.py.)
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from lmpipe import tracking
from lmpipe.errors import TrackingError
from tests.helpers import ROOT



def test_unreachable_tracking_server_fails_in_one_line_within_the_timeout(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")
    started = time.monotonic()
    with pytest.raises(TrackingError, match=r"MLFLOW_TRACKING_URI=http://127.0.0.1:9: no MLflow server answered "
                                            r"within 2 s .*unset MLFLOW_TRACKING_URI"):
        tracking.store.prepare_store(timeout=2)
    assert time.monotonic() - started < 5


def test_sqlite_store_in_a_missing_directory_is_refused_not_created(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/nonexistent/dir/x.db")
    with pytest.raises(TrackingError, match="nonexistent/dir is not an existing directory"):
        tracking.store.prepare_store(timeout=2)
    assert not (tmp_path / "nonexistent").exists()
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/file/x.db")  # its "directory" is a file
    with pytest.raises(TrackingError, match="file is not an existing directory"):
        tracking.store.prepare_store(timeout=2)


STAGE = """
import sys
from lmpipe import tracking
tracking.store.prepare_store(30)
with tracking.runs.open_stage_run(sys.argv[1], "exp", {"x": {"y": 1}}, "h", params_file=sys.argv[2]):
    tracking.log_metrics({"done": 1})
"""


def test_two_first_runs_on_one_new_store_are_both_recorded(tmp_path, params_file):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'new.db'}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    env.pop("LMPIPE_PARENT_RUN_ID", None)
    runs = [subprocess.Popen([sys.executable, "-c", STAGE, f"stage{i}", str(tmp_path / "params.yaml")], env=env,
                             cwd=ROOT, stderr=subprocess.PIPE, text=True) for i in range(2)]
    for process in runs:
        _, err = process.communicate(timeout=300)
        assert process.returncode == 0, err[-2000:]
    client = MlflowClient(uri)
    recorded = client.search_runs([client.get_experiment_by_name("exp").experiment_id], "tags.`lmpipe.role` = 'stage'")
    assert sorted(r.data.tags["lmpipe.stage"] for r in recorded) == ["stage0", "stage1"]


def test_truncated_token_stream_names_the_file_and_the_fix(tmp_path):
    import json

    import numpy as np

    from lmpipe.errors import CorpusError
    from lmpipe.splits import load_tokens

    for name in ("train", "valid", "test"):
        np.save(tmp_path / f"{name}.npy", np.arange(1000, dtype=np.uint16))
    (tmp_path / "counts.json").write_text(json.dumps({"vocab_size": 1000, "boundary_id": 0,
                                                      "words": dict.fromkeys(("train", "valid", "test"), 1),
                                                      "bytes": dict.fromkeys(("train", "valid", "test"), 1)}))
    whole = (tmp_path / "train.npy").read_bytes()
    (tmp_path / "train.npy").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(CorpusError, match=r"train.npy: not a readable token stream .*dvc repro --force tokenize"):
        load_tokens(tmp_path)


GHOST = """
import os, signal, sys
from lmpipe import tracking
with tracking.runs.open_stage_run("train@gru", sys.argv[3], {"x": {"y": 1}}, "h", params_file=sys.argv[1]):
    if sys.argv[2] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)  # dies without a word: its run stays RUNNING
    raise KeyboardInterrupt
"""


def test_a_dead_stages_run_is_ended_by_the_studys_driver_never_by_another_stage(tmp_path, params_file, monkeypatch):
    """SIGKILL leaves a RUNNING run behind. The next stage leaves it alone: a stage ends its own run only (Ctrl-C:
    KILLED). `make study`'s driver ends it FAILED before its first stage and says so; a run whose process lives stays
    RUNNING."""
    from mlflow.tracking import MlflowClient

    from lmpipe.config import load_params
    from tests.helpers import with_fake_dvc

    experiment = load_params(params_file).tracking.experiment
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = with_fake_dvc(tmp_path, "exit 0\n")  # its store: `uri`
    client = MlflowClient(uri)

    def stages():
        found = client.search_runs([client.get_experiment_by_name(experiment).experiment_id],
                                   "tags.`lmpipe.role` = 'stage'")
        return sorted(r.info.status for r in found)

    def stage(how):
        subprocess.run([sys.executable, "-c", GHOST, str(params_file), how, experiment], env=env, cwd=ROOT,
                       capture_output=True, timeout=300)
        return stages()

    assert stage("kill") == ["RUNNING"]
    assert stage("interrupt") == ["KILLED", "RUNNING"]  # the next stage ended its own run, not the ghost
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    with tracking.runs.run(experiment, "alive") as alive:
        study = subprocess.run([sys.executable, "-m", "lmpipe_cli.progress"], cwd=tmp_path, env=env,
                               capture_output=True, text=True, timeout=300)
        assert study.returncode == 0, study.stderr[-2000:]
        assert study.stdout.splitlines()[0] == ("[study] ended FAILED 1 MLflow run(s) left RUNNING by a process that "
                                                "died: train@gru")
        assert stages() == ["FAILED", "KILLED"]
        ended = [r for r in client.search_runs([alive.info.experiment_id], "attributes.status = 'FAILED'")]
        assert [r.data.tags["lmpipe.ended"] for r in ended] == ["its process died; ended by make study"]
        assert client.get_run(alive.info.run_id).info.status == "RUNNING"
        assert tracking.runs.end_ghost_runs(experiment, "make study") is None  # nothing left to end


def test_a_tracking_server_that_answers_health_but_fails_its_api_fails_the_stage_in_one_line_quickly(monkeypatch):
    """Without a limit MLflow retries 7 times with backoff: 4 min 10 s, then a 107-line traceback."""
    from tests.helpers import QuietHandler, http_server

    class HalfAlive(QuietHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 500)
            self.end_headers()
            self.wfile.write(b"OK" if self.path == "/health" else b"internal error")

        do_POST = do_GET

    for name in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "MLFLOW_HTTP_REQUEST_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    started = time.monotonic()
    try:
        with http_server(HalfAlive) as uri, pytest.raises(TrackingError) as info:
            monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
            tracking.store.prepare_store(timeout=5)
    finally:
        for name in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "MLFLOW_HTTP_REQUEST_TIMEOUT"):
            os.environ.pop(name, None)
    assert time.monotonic() - started < 30
    message = str(info.value)
    assert message.startswith(f"MLFLOW_TRACKING_URI={uri}: the MLflow server answers /health but its API fails")
    assert "\n" not in message


def test_a_user_error_is_said_once_and_not_again_in_prefects_reports():
    import logging

    from flows._stage import _OneLineUserErrors
    from lmpipe.errors import ConfigError

    def record(message, exc=None):
        return logging.LogRecord("prefect.flow_runs", logging.ERROR, __file__, 1, message, None,
                                 (type(exc), exc, None) if exc else None)

    keep = _OneLineUserErrors().filter
    said = "params.yaml: models.gru.budget: must be > 0"
    assert not keep(record(f"Task run failed with exception: ConfigError('{said}')"))
    assert not keep(record(f"Finished in state Failed('Flow run encountered an exception: ConfigError: {said}')"))
    assert not keep(record("Encountered exception during execution", ConfigError(said)))
    assert keep(record("Finished in state Failed('Flow run encountered an exception: ValueError: a bug')"))
    assert keep(record("Beginning flow run 'train' for flow 'train'"))


def test_a_model_name_with_a_space_fails_on_the_name_rule_not_on_dvcs_command_line(tmp_path):
    """DVC runs `python -m flows.train --model gru small` for such a name: params.yaml's rule says what is wrong,
    and a stage DVC never ran before has no outputs to restore, so the line offers none."""
    import os
    import subprocess
    import sys

    import yaml


    tree = yaml.safe_load((ROOT / "params.yaml").read_text())
    tree["models"]["gru small"] = tree["models"]["gru"]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(tree, sort_keys=False))
    env = {**os.environ, "DVC_STAGE": "train@gru small", "DVC_ROOT": str(tmp_path), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "flows.train", "--model", "gru", "small"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "error: params.yaml: models: model name 'gru small': use lowercase letters, digits, '-' and '_', starting "
        "with a letter, at most 40 characters (it names a DVC stage, a folder and an MLflow model)"]
