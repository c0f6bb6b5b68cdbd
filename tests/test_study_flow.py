"""The study flow's choice of task runner, and the one-line error for a combination it cannot run."""

from __future__ import annotations

import os

import pytest
import yaml

from flows.runners import task_runner
from flows.study import study
from lmpipe.config import OrchestrationParams
from lmpipe.errors import ConfigError
from tests.helpers import project_params, section


def test_dask_runner_starts_a_loopback_cluster_of_single_threaded_workers():
    runner = task_runner(OrchestrationParams(**section("orchestration", task_runner="dask", workers=3)))
    assert runner.cluster_class == "distributed.LocalCluster"
    assert runner.cluster_kwargs == {"n_workers": 3, "threads_per_worker": 1, "processes": True,
                                     "host": "127.0.0.1", "dashboard_address": None}


def test_dask_runner_joins_a_running_scheduler_at_address():
    runner = task_runner(OrchestrationParams(**section("orchestration", task_runner="dask",
                                                       address="tcp://10.1.2.3:8786")))
    assert runner.address == "tcp://10.1.2.3:8786"  # only configured: nothing connects until a flow runs


def test_overrides_with_a_parallel_runner_are_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(project_params(orchestration={"task_runner": "dask"})))
    with pytest.raises(ConfigError, match=r"params.yaml: orchestration.task_runner 'dask' runs the study in the "
                                          r"workspace; set the values in params.yaml instead of passing overrides"):
        study.fn(overrides=["models.lstm.epochs=3"])
    assert not (tmp_path / "mlflow.db").exists()  # refused before any run was recorded


def test_the_stages_before_training_come_from_dvc_yaml():
    from flows.study import stages_before_training
    from tests.helpers import ROOT

    assert stages_before_training(ROOT / "dvc.yaml") == ["tokenize"]  # train@<model> reads data/tokens


def test_a_second_study_says_who_runs_and_never_advises_removing_a_live_lock(tmp_path):
    import json
    import subprocess
    import sys

    from flows.study import dvc_lock_holder, one_study
    from lmpipe.errors import LmpipeError

    lock = tmp_path / "study.lock"
    holder = subprocess.Popen([sys.executable, "-c", f"""
import time
from pathlib import Path
from flows.study import one_study
with one_study(Path({str(lock)!r})):
    print("held", flush=True)
    time.sleep(60)
"""], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(LmpipeError) as info:
            with one_study(lock):
                pass
        assert str(info.value).startswith(f"another study is running in this project (pid {holder.pid})")
        assert "remove none" in str(info.value)
    finally:
        holder.kill()
        holder.wait()
    with one_study(lock):  # a dead holder's lock is free again
        pass
    (tmp_path / ".dvc/tmp").mkdir(parents=True)
    (tmp_path / ".dvc/tmp/rwlock").write_text(json.dumps({"write": {"data/x": {"pid": os.getpid(), "cmd": "dvc repro"}},
                                                          "read": {}}))
    assert dvc_lock_holder(tmp_path) == f"pid {os.getpid()} (dvc repro)"
    (tmp_path / ".dvc/tmp/rwlock").write_text(json.dumps({"write": {"data/x": {"pid": 2**22 + 7, "cmd": "dvc"}}}))
    assert dvc_lock_holder(tmp_path) is None


def test_a_typo_in_an_override_stops_before_dvc_runs_anything(tmp_path, params_file, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"params.yaml with models.lstm.optim.lr=fast: models.lstm.optim"):
        study.fn(overrides=["models.lstm.optim.lr=fast"])
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / ".cache").exists()  # no run, no lock taken
