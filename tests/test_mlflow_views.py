"""The MLflow views `lmpipe ui` prints: the runs that made the models the workspace holds, best test bpb first."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from lmpipe import mlflow_views as views
from lmpipe import tracking
from tests.conftest import ROOT, free_port

CHROMIUM = shutil.which("chromium")
# test bpb of each model folder's run: a model and the n-gram, in an order that is neither the runs' nor the names'
RESULTS = {"gru": 1.9589, "nplm": 2.1947, "transformer": 1.9206, "ngram": 2.0485, "rnn": 2.0491, "lstm": 1.9563}


def make_runs(tmp_path: Path, params: Path, results: dict) -> dict:
    """A run per model folder that made it (tagged with the folder's hash), with its test metrics; {folder: run id}."""
    ids = {}
    for name, bpb in results.items():
        folder = tmp_path / "models" / name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "model.pt").write_text(f"{name} {bpb}")
        stage = "ngram" if name == "ngram" else f"train@{name}"
        with tracking.runs.open_stage_run(stage, "lmpipe", {}, "h", params_file=params) as run:
            tracking.log_metrics({"test_bpb": bpb, "test_word_ppl": 2 ** (bpb * 5.6), "test_ppl": 100 * bpb})
            tracking.mark_output(folder)
            ids[name] = run.info.run_id
    return ids


@pytest.fixture()
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.delenv("LMPIPE_PARENT_RUN_ID", raising=False)
    monkeypatch.chdir(tmp_path)
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    return tmp_path / "params.yaml"


def test_the_leaderboard_view_holds_the_runs_that_made_the_models_the_workspace_holds(store, tmp_path, monkeypatch):
    assert views.current_runs("lmpipe", ["models/gru", "models/ngram"]) == []  # nothing trained yet
    ids = make_runs(tmp_path, store, {"gru": 2.0, "ngram": 2.1})
    make_runs(tmp_path, store, {"gru": 1.9})  # a retrain replaces the gru: its first run made no file here now
    monkeypatch.setenv("DVC_EXP_NAME", "lanky-bass")  # nor does an experiment's run that left the workspace as it was
    with tracking.runs.open_stage_run("train@gru", "lmpipe", {}, "h", params_file=store):
        pass
    runs = views.current_runs("lmpipe", ["models/gru", "models/ngram", "models/gone"])
    assert ids["gru"] not in runs and ids["ngram"] in runs and len(runs) == 2

    key = views.share("lmpipe", views.leaderboard_state(runs))
    assert views.share("lmpipe", views.leaderboard_state(runs)) == key  # the same view: the same key, one tag
    experiment = MlflowClient().get_experiment_by_name("lmpipe")
    state = json.loads(experiment.tags[views.SHARED_VIEW + key])
    assert state["searchFilter"] == f"attributes.run_id IN ('{runs[0]}', '{runs[1]}')"
    assert (state["orderByKey"], state["orderByAsc"]) == ("metrics.`test_bpb`", True)
    assert state["selectedColumns"][:2] == ["metrics.`test_bpb`", "metrics.`test_word_ppl`"]
    found = MlflowClient().search_runs([experiment.experiment_id], state["searchFilter"])  # MLflow's own reading
    assert sorted(r.info.run_id for r in found) == runs
    url = views.view_url("http://ui", "lmpipe", key)
    assert url == f"http://ui/#/experiments/{experiment.experiment_id}/runs?workflowType=machine_learning" \
                  f"&viewStateShareKey={key}"


def dom(url: str, seconds: int = 40) -> str:
    """The page at `url` as headless Chromium has it after `seconds` of virtual time (the scripts have run)."""
    with tempfile.TemporaryDirectory() as profile:
        done = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                               "--disable-background-networking", "--disable-component-update", "--disable-sync",
                               "--no-first-run", f"--user-data-dir={profile}", "--window-size=1400,1000",
                               f"--virtual-time-budget={seconds * 1000}", "--dump-dom", url],
                              capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def leaderboard_page(project: Path) -> str:
    """`lmpipe ui` in `project`: the page its "best test bpb first" link opens, as a browser has it."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    ui = subprocess.Popen([sys.executable, "-m", "flows.cli", "ui", "--port", str(port)], cwd=project, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    stuck = threading.Timer(300, os.killpg, (ui.pid, 9))  # a UI that never answers ends the read below
    stuck.start()
    try:
        lines = []
        for line in ui.stdout:
            lines.append(line)
            if line.startswith("champions"):
                break
        link = next((line.split(": ", 1)[1].strip() for line in lines if "workspace holds, best test bpb first" in line), None)
        assert link, f"lmpipe ui printed no link to the models: {lines}"
        return dom(link)
    finally:
        stuck.cancel()
        os.killpg(ui.pid, 15)
        ui.wait(timeout=30)


def assert_best_first(page: str, results: dict) -> None:
    """Every model's run on the page, in order of test bpb, each with its test bpb."""
    names = {name: ("ngram" if name == "ngram" else f"train@{name}") for name in results}
    shown = {name: page.find(f">{run}<") for name, run in names.items()}
    assert all(at > 0 for at in shown.values()), f"not on the page: {[n for n, at in shown.items() if at < 0]}"
    assert sorted(shown, key=shown.get) == sorted(results, key=results.get)  # best test bpb first
    for bpb in results.values():  # the cell holds the whole number (the screen shows as much of it as fits)
        assert f">{bpb!r}<" in page, bpb
    assert "test_word_ppl" in page and "test_ppl" not in page  # the headline columns only


browser = pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium)")


@pytest.mark.browser
@browser
def test_the_printed_link_shows_every_model_s_test_bpb_best_first_without_a_click(store, tmp_path):
    make_runs(tmp_path, store, RESULTS)
    assert_best_first(leaderboard_page(tmp_path), RESULTS)


@pytest.mark.browser
@browser
def test_after_the_study_its_six_models_are_on_the_printed_link(monkeypatch):
    """On this checkout's own store, once `make study` has run: the five neural models and the n-gram."""
    evaluated = ROOT / "metrics/eval"
    results = {p.stem: json.loads(p.read_text())["test"]["bpb"] for p in sorted(evaluated.glob("*.json"))}
    if len(results) < 6 or not (ROOT / "mlflow.db").exists():
        pytest.skip("no study in this checkout's MLflow store yet: run make study first")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(ROOT)
    if len(views.current_runs("lmpipe", [ROOT / "models" / m for m in results])) < len(results):
        pytest.skip("this checkout's MLflow store does not hold the runs of its models: run make study first")
    assert_best_first(leaderboard_page(ROOT), results)
