"""What a retrain refuses, and how it says so."""

from __future__ import annotations

from flows.retrain import refusal, reproduction_outputs
from tests.conftest import ROOT


def test_changes_that_a_reproduction_wrote_get_the_command_that_fixes_them(monkeypatch):
    monkeypatch.chdir(ROOT)
    written = reproduction_outputs()
    assert {"dvc.lock", "metrics/weat.json", "metrics/eval.json", "reports/study.md"} <= written
    assert not {"params.yaml", "lmpipe/muon.py", "models/gru"} & written  # code, settings, DVC-cached outputs
    line = refusal(["dvc.lock", "metrics/weat.json"])
    assert "all of them what `dvc repro` writes" in line
    assert "`git commit -m 'Study reproduced here' -- dvc.lock metrics/weat.json`" in line
    assert "`git checkout -- dvc.lock metrics/weat.json`" in line and "\n" not in line
    other = refusal(["dvc.lock", "params.yaml"])
    assert other == ("uncommitted changes to dvc.lock, params.yaml: a retrain commits its outcome on top of HEAD; "
                     "commit or stash them first")


def test_what_a_killed_retrain_left_is_removed_and_named(tmp_path, monkeypatch):
    from flows.retrain import remove_leftovers

    monkeypatch.chdir(tmp_path)
    copy = tmp_path / ".dvc/tmp/exps/standalone/tmpk1ll3d"
    (copy / "models/gru").mkdir(parents=True)
    (copy / "models/gru/model.pt").write_bytes(b"x" * 1000)
    (tmp_path / ".dvc/tmp/exps/run").mkdir(parents=True)
    (tmp_path / ".dvc/tmp/exps/run/lmpipe-retrain.run").write_text("{}")
    (tmp_path / ".dvc/tmp/exps/cache").mkdir()  # DVC's own, not a run's: stays
    assert [p.as_posix() for p in remove_leftovers()] == [
        ".dvc/tmp/exps/run/lmpipe-retrain.run", ".dvc/tmp/exps/standalone/tmpk1ll3d"]
    assert not copy.exists() and (tmp_path / ".dvc/tmp/exps/cache").is_dir()
    assert remove_leftovers() == []


def test_a_refusal_of_many_files_is_one_short_line_that_counts_them(monkeypatch):
    monkeypatch.chdir(ROOT)
    dirty = sorted(reproduction_outputs())[:30]  # what a reproduction on another CPU can leave
    line = refusal(dirty)
    assert len(line) < 500 and "\n" not in line, line
    assert line.startswith(f"uncommitted changes to {', '.join(dirty[:4])} and 26 more, all of them what `dvc repro`")
    assert "`git commit -am 'Study reproduced here'`" in line and "`git checkout -- .`" in line
    assert dirty[10] not in line


REFUSED_FIRINGS = """
from prefect import flow
from flows.retrain import paused_firing, refused, reproduction_outputs

dirty = sorted(reproduction_outputs())[:30]


@flow(name="retrain-refusal-probe")
def firing():  # as the scheduled retrain starts: a paused schedule's firing is skipped, a changed tree refused
    return paused_firing() or refused(dirty)


print("first:", firing(return_state=True).type.value)
print("second:", firing(return_state=True).type.value)
"""


def test_a_scheduled_retrain_on_a_changed_tree_fails_once_in_one_line_and_names_the_command_that_resumes_it(
        prefect_api):
    """The firing on a changed tree ends Failed with the short refusal as its message, pauses its schedule and names
    the one command that resumes it; its log has that line and no traceback. A firing the runner had already taken
    is skipped (Cancelled) in a line of its own, without saying the why again."""
    import os
    import subprocess
    import sys

    import requests

    flow_id = requests.post(f"{prefect_api}/flows/", json={"name": "retrain"}, timeout=10).json()["id"]
    made = requests.post(f"{prefect_api}/deployments/", timeout=10, json={
        "name": "refusal-probe", "flow_id": flow_id, "paused": False,
        "schedules": [{"schedule": {"interval": 600}, "active": False}]})  # inactive: the server makes no runs
    assert made.status_code in (200, 201), made.text
    deployment = made.json()["id"]
    env = {**os.environ, "PREFECT_API_URL": prefect_api, "PREFECT__RUNTIME__DEPLOYMENT__ID": deployment,
           "PREFECT__RUNTIME__DEPLOYMENT__NAME": "refusal-probe"}
    try:
        done = subprocess.run([sys.executable, "-c", REFUSED_FIRINGS], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=300)
        said = done.stdout + done.stderr
        assert done.returncode == 0 and "first: FAILED" in said and "second: CANCELLED" in said, said[-3000:]
        assert "Traceback" not in said and said.count("uncommitted changes") == 1, said[-3000:]
        assert requests.get(f"{prefect_api}/deployments/{deployment}", timeout=10).json()["paused"]
        runs = requests.post(f"{prefect_api}/flow_runs/filter", timeout=10, json={
            "flows": {"name": {"any_": ["retrain-refusal-probe"]}}, "sort": "EXPECTED_START_TIME_ASC"}).json()
        failed, skipped = (r["state"]["message"] for r in runs[-2:])
        resume = "restart `lmpipe schedule --interval 600 --name refusal-probe` to resume it"
        assert failed.startswith("uncommitted changes to ") and failed.endswith(resume) and len(failed) < 600, failed
        assert skipped.startswith("skipped: the schedule is paused") and skipped.endswith(resume), skipped
    finally:
        requests.delete(f"{prefect_api}/deployments/{deployment}", timeout=10)
