"""What a retrain refuses, and how it says so."""

from __future__ import annotations

import difflib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from lmpipe_cli.retrain import experiment_ref, refusal, reproduction_outputs
from tests.helpers import ROOT


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
    from lmpipe_cli.retrain import remove_leftovers

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


EVALUATE = """import json, sys, yaml
lr = yaml.safe_load(open("params.yaml"))["models"]["gru"]["optim"]["lr"]
json.dump({"models": {"gru": {"test": {"word_ppl": 100.0, "bpb": 2.0}}}, "lr": lr}, open("metrics/eval.json", "w"))
"""


@pytest.fixture
def tiny_project(tmp_path, params_file, monkeypatch):
    """A git + DVC project with the real params.yaml (its comments and inline maps) and one stage that depends on
    models.gru.optim.lr and writes a metrics/eval.json the gate reads: a real `dvc exp run` of it takes seconds. The
    retrain's outside world (the corpus source, MLflow, Prefect's logger and artifacts) is stubbed; its tags are
    kept in the returned dict."""
    import lmpipe_cli.plan
    import lmpipe_cli.retrain as retrain

    monkeypatch.chdir(tmp_path)
    Path("README.md").write_text("# a project\n")
    Path("evaluate.py").write_text(EVALUATE)
    Path("metrics").mkdir()
    Path("dvc.yaml").write_text(yaml.safe_dump({"stages": {"evaluate": {
        "cmd": f"{sys.executable} evaluate.py", "deps": ["evaluate.py"], "params": ["models.gru.optim.lr"],
        "outs": [{"metrics/eval.json": {"cache": False}}]}}}))
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    for command in (["git", "init", "-q"], ["dvc", "init", "-q"], ["dvc", "repro", "-q"], git + ["add", "-A"],
                    git + ["commit", "-qm", "a project"]):
        subprocess.run(command, check=True, capture_output=True)
    monkeypatch.setenv("GIT_AUTHOR_NAME", "t")
    monkeypatch.setenv("GIT_AUTHOR_EMAIL", "t@t")
    monkeypatch.setenv("GIT_COMMITTER_NAME", "t")
    monkeypatch.setenv("GIT_COMMITTER_EMAIL", "t@t")
    tags: dict = {}
    monkeypatch.setattr(retrain, "get_run_logger", lambda: logging.getLogger("retrain"))
    monkeypatch.setattr(retrain, "create_markdown_artifact", lambda *a, **k: None)
    monkeypatch.setattr(retrain, "fetched_sha256", lambda corpus: "the same corpus")
    monkeypatch.setattr(retrain, "corpus_sha256", lambda folder: "the same corpus")
    monkeypatch.setattr(retrain, "stage_env", lambda parent: dict(os.environ))
    monkeypatch.setattr(retrain, "dvc", getattr(retrain.dvc, "fn", retrain.dvc))  # a Prefect task: its function
    monkeypatch.setattr(lmpipe_cli.plan, "plan", lambda sets: "a plan")
    monkeypatch.setattr(retrain.tracking, "set_tags", lambda run, values: tags.update(values))
    monkeypatch.setattr(retrain.tracking.registry, "champion_metrics", lambda models: {})
    monkeypatch.setattr(retrain.tracking.registry, "promote_experiment", lambda name: {"lmpipe-gru": "2"})
    return tags


def gated(overrides: list[str]) -> dict:
    from lmpipe_cli.retrain import gated_retrain, workspace_now
    from lmpipe.config import load_params

    return gated_retrain(load_params("params.yaml"), "parent", overrides, workspace_now())


def git_out(*args: str) -> str:
    return subprocess.run(["git", *args], check=True, capture_output=True, text=True).stdout


def test_a_passing_retrain_commits_params_yaml_changed_only_where_the_value_changed(tiny_project):
    """DVC's `-S` rewrites the whole params.yaml in its own style, comments gone; the commit holds HEAD's text with
    the one value changed in place."""
    from lmpipe.params_file import edit_params

    head = Path("params.yaml").read_text()
    outcome = gated(["models.gru.optim.lr=0.003"])
    assert outcome["decision"] == "passed" and tiny_project["lmpipe.retrain.decision"] == "passed"
    assert outcome["said"].startswith(f"applied {outcome['experiment']} as commit {outcome['commit'][:12]}")
    assert git_out("status", "--porcelain") == "" and git_out("rev-parse", "HEAD~1").strip() != outcome["commit"]
    diff = git_out("diff", "-U0", "HEAD~1", "HEAD", "--", "params.yaml")
    changed = [line for line in diff.splitlines() if line[:1] in "+-" and line[:3] not in ("+++", "---")]
    assert len(changed) == 2 and "lr: 0.004" in changed[0] and "lr: 0.003" in changed[1], diff
    assert changed[1].startswith("+    optim: {name: muon, lr: 0.003,"), diff  # the inline map stays inline
    assert Path("params.yaml").read_text() == edit_params(head, ["models.gru.optim.lr=0.003"])
    assert json.loads(Path("metrics/eval.json").read_text())["lr"] == 0.003  # the experiment's outputs, committed
    dvc_style = git_out("show", f"{experiment_ref(outcome['experiment'])}:params.yaml")
    rewrapped = [line for line in difflib.ndiff(head.splitlines(), dvc_style.splitlines()) if line[:1] in "+-"]
    assert len(rewrapped) > 20  # what DVC alone would have committed (`url: null` as `url:`, maps rewrapped)


def test_a_retrain_that_passes_while_the_user_edits_applies_nothing_and_says_how_to_apply_it(tiny_project,
                                                                                              monkeypatch):
    """README.md and params.yaml edited while the experiment runs: applying would write over them, so nothing is
    applied, the edits stay exactly as made (no stash), the experiment stays, and one line says how to apply it."""
    import lmpipe_cli.retrain as retrain

    real = retrain.run_experiment
    readme = Path("README.md").read_text() + "A note of the user's.\n"
    params = Path("params.yaml").read_text().replace("max_regression: 0.05", "max_regression: 0.06", 1)

    def run_while_the_user_edits(name, sets, env):
        real(name, sets, env)
        Path("README.md").write_text(readme)
        Path("params.yaml").write_text(params)

    monkeypatch.setattr(retrain, "run_experiment", run_while_the_user_edits)
    head = git_out("rev-parse", "HEAD")
    outcome = gated(["models.gru.optim.lr=0.003"])
    name = outcome["experiment"]
    assert outcome["decision"] == tiny_project["lmpipe.retrain.decision"] == "passed, not applied: workspace changed"
    assert outcome["said"] == (f"{name} passed but is not applied: README.md, params.yaml changed while it ran, and "
                               "those changes stay as they are; the experiment stays: once they are committed or "
                               f"stashed, `dvc exp apply {name}` and a commit apply it")
    assert Path("README.md").read_text() == readme and Path("params.yaml").read_text() == params
    assert git_out("rev-parse", "HEAD") == head and git_out("stash", "list") == ""
    assert json.loads(Path("metrics/eval.json").read_text())["lr"] == 0.004  # HEAD's outputs, as they were
    assert experiment_ref(name)  # there to apply later


def test_what_applying_would_take_is_named_and_nothing_else(tiny_project):
    """A moved HEAD, an edited tracked file, a new file where the experiment writes stop the apply; a new file
    elsewhere or an ignored one does not."""
    from lmpipe_cli.retrain import workspace_changes, workspace_now

    start = workspace_now()
    Path("notes.txt").write_text("mine, elsewhere")
    Path(".dvc/tmp/scratch").write_text("ignored")
    written = ["dvc.lock", "metrics/eval.json", "params.yaml"]
    assert workspace_changes(start, written) == []
    Path("metrics/my-note.md").write_text("mine, beside the metrics")
    assert workspace_changes(start, written) == ["metrics/my-note.md"]
    Path("metrics/my-note.md").unlink()
    Path("README.md").write_text("edited\n")
    assert workspace_changes(start, written) == ["README.md"]
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qam", "the user's"], check=True)
    (moved,) = workspace_changes(start, written)
    assert moved.startswith(f"HEAD (moved from {start.head[:12]} to ")


def test_sigterm_in_a_flow_that_takes_it_as_ctrl_c_is_a_keyboard_interrupt(prefect_api):
    """Prefect's flow engine installs its own SIGTERM handler for a run (a crash, the process killed again);
    `sigterm_as_ctrl_c` gives the flow Ctrl-C's path, and the handler from before the run is back after it."""
    from prefect import flow
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows._stage import _terminated, sigterm_as_ctrl_c

    @flow
    def stopped_by_sigterm() -> str:
        sigterm_as_ctrl_c()
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        except KeyboardInterrupt:
            return "as ctrl-c"
        return "not stopped"

    before = signal.signal(signal.SIGTERM, _terminated)
    try:
        with temporary_settings({PREFECT_API_URL: prefect_api}):
            assert stopped_by_sigterm() == "as ctrl-c"
        assert signal.getsignal(signal.SIGTERM) is _terminated
    finally:
        signal.signal(signal.SIGTERM, before)


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
from lmpipe_cli.retrain import paused_firing, refused, reproduction_outputs

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

    from tests.helpers import ask_prefect

    flow_id = ask_prefect("POST", f"{prefect_api}/flows/", json={"name": "retrain"}).json()["id"]
    made = ask_prefect("POST", f"{prefect_api}/deployments/", json={
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
        assert ask_prefect("GET", f"{prefect_api}/deployments/{deployment}").json()["paused"]
        runs = ask_prefect("POST", f"{prefect_api}/flow_runs/filter", json={
            "flows": {"name": {"any_": ["retrain-refusal-probe"]}}, "sort": "EXPECTED_START_TIME_ASC"}).json()
        failed, skipped = (r["state"]["message"] for r in runs[-2:])
        resume = "restart `lmpipe schedule --interval 600 --name refusal-probe` to resume it"
        assert failed.startswith("uncommitted changes to ") and failed.endswith(resume) and len(failed) < 600, failed
        assert skipped.startswith("skipped: the schedule is paused") and skipped.endswith(resume), skipped
    finally:
        ask_prefect("DELETE", f"{prefect_api}/deployments/{deployment}")
