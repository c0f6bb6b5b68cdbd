"""`lmpipe retrain` and `lmpipe schedule` on a committed copy of the studied project: the gate's decisions, what is
applied, and stops by Ctrl-C or SIGTERM."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from tests.helpers import (MODELS, as_in_a_terminal, ask_prefect, has_row, newest_flow_run_state, override, run, stop,
                           workspace)

pytestmark = pytest.mark.e2e


def created_flow_run(url: str) -> str:
    """The id of the run the server creates on a POST to a deployment's create_flow_run."""
    answer = ask_prefect("POST", url, json={})
    assert answer.ok, f"{answer.status_code}: {answer.text[:500]}"
    return answer.json()["id"]


@pytest.mark.slow
def test_a_scheduled_retrain_fires_by_itself_and_reaches_a_decision(committed, prefect_api):
    """The schedule, not a manual trigger: the server's scheduler creates the run, the served worker starts it, and
    the retrain decides (nothing changed upstream). Prefect 3.8.8's scheduler fails on SQLAlchemy 2.1 and no run is
    ever created: this test fails on those pins."""
    import time

    copy, env = committed
    log = open(copy / "schedule.log", "wb")
    serve = subprocess.Popen(["lmpipe", "schedule", "--interval", "15", "--name", "e2e-interval"], cwd=copy,
                             env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline, found, seen = time.monotonic() + 300, None, set()
        while time.monotonic() < deadline:
            runs = ask_prefect("POST", f"{prefect_api}/flow_runs/filter", json={
                "deployments": {"name": {"any_": ["e2e-interval"]}}, "sort": "EXPECTED_START_TIME_ASC"}).json()
            seen |= {r["state_type"] for r in runs}
            found = next((r for r in runs if r["state_type"] in ("COMPLETED", "FAILED", "CRASHED")), None)
            if found:
                break
            time.sleep(2)
        assert found, f"no scheduled run finished in 300 s (states seen: {seen})\n" + \
            (copy / "schedule.log").read_text()[-3000:]
        assert found["auto_scheduled"] and found["state_type"] == "COMPLETED", found["state"]
        artifacts = ask_prefect("POST", f"{prefect_api}/artifacts/filter",
                                json={"artifacts": {"flow_run_id": {"any_": [found["id"]]}}}).json()
        assert any("nothing to retrain" in (a.get("data") or "") for a in artifacts)
        assert retrain_runs(copy)[0].data.tags["lmpipe.retrain.decision"] == "unchanged"
    finally:
        stop(serve)
        log.close()
        for deployment in ask_prefect("POST", f"{prefect_api}/deployments/filter",
                                      json={"deployments": {"name": {"any_": ["e2e-interval"]}}}).json():
            ask_prefect("DELETE", f"{prefect_api}/deployments/{deployment['id']}")  # and its runs ahead
    served = (copy / "schedule.log").read_text()
    assert "on every 15 s via" in served and "nothing to retrain: the corpus source and the pipeline are unchanged" \
        in served, served[-3000:]


@pytest.mark.slow
def test_scheduled_retrain_deployment_registers_and_runs(committed, prefect_api):
    import time

    copy, env = committed
    log = open(copy / "schedule.log", "wb")
    serve = subprocess.Popen(["lmpipe", "schedule", "--cron", "0 3 * * 1", "--name", "e2e-retrain"], cwd=copy,
                             env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline, deployment = time.monotonic() + 120, None
        while deployment is None and time.monotonic() < deadline:
            found = ask_prefect("POST", f"{prefect_api}/deployments/filter",
                                json={"deployments": {"name": {"any_": ["e2e-retrain"]}}}).json()
            deployment = found[0] if found else time.sleep(1)
        assert deployment, (copy / "schedule.log").read_text()[-2000:]
        assert [s["schedule"]["cron"] for s in deployment["schedules"]] == ["0 3 * * 1"]
        run_id = created_flow_run(f"{prefect_api}/deployments/{deployment['id']}/create_flow_run")
        deadline, state = time.monotonic() + 400, None
        while time.monotonic() < deadline:
            state = ask_prefect("GET", f"{prefect_api}/flow_runs/{run_id}").json()["state_type"]
            if state in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
                break
            time.sleep(2)
        detail = ask_prefect("GET", f"{prefect_api}/flow_runs/{run_id}").json()["state"]
        assert state == "COMPLETED", f"{detail}\n" + (copy / "schedule.log").read_text()[-3000:]
        artifacts = ask_prefect("POST", f"{prefect_api}/artifacts/filter",
                                json={"artifacts": {"flow_run_id": {"any_": [run_id]}}}).json()
        assert any("nothing to retrain" in (a.get("data") or "") for a in artifacts)  # same corpus, same code
        assert json.loads(run(["dvc", "status", "--json", "dvc.yaml"], copy, env).stdout) == {}  # nothing left to do
        assert (deployment["global_concurrency_limit"] or {}).get("limit") == 1, deployment
        assert deployment["concurrency_options"]["collision_strategy"] == "CANCEL_NEW"
        both = [created_flow_run(f"{prefect_api}/deployments/{deployment['id']}/create_flow_run") for _ in range(2)]
        deadline, states = time.monotonic() + 400, []
        while time.monotonic() < deadline:  # two firings at once: one retrains, the other is cancelled
            states = sorted(ask_prefect("GET", f"{prefect_api}/flow_runs/{r}").json()["state_type"] for r in both)
            if all(s in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED") for s in states):
                break
            time.sleep(2)
        assert states == ["CANCELLED", "COMPLETED"], (copy / "schedule.log").read_text()[-3000:]
    finally:
        stop(serve)
        log.close()
    served = (copy / "schedule.log").read_text()
    assert "stopped serving 'retrain/e2e-retrain'" in served and "never awaited" not in served, served[-2000:]


def champions(copy: Path) -> dict:
    client = MlflowClient(f"sqlite:///{copy / 'mlflow.db'}")
    return {m: str(client.get_model_version_by_alias(f"lmpipe-{m}", "champion").version) for m in MODELS}


def retrain_runs(copy: Path) -> list:
    client = MlflowClient(f"sqlite:///{copy / 'mlflow.db'}")
    exp = client.get_experiment_by_name("lmpipe")
    return client.search_runs([exp.experiment_id], "tags.`lmpipe.driver` = 'retrain'",
                              order_by=["attributes.start_time DESC"])


PREFECT_LOG = re.compile(r"\d\d:\d\d:\d\d\.\d+ \| ")  # a line of Prefect's console log: '01:43:20.925 | INFO | ...'


@pytest.mark.slow
def test_a_retrain_whose_models_regress_changes_nothing_users_read(committed, prefect_api):
    """(b) A crippled model: the gate fails, HEAD, the workspace and the champions stay, the experiment stays."""
    copy, env = committed
    before, crowned = workspace(copy), champions(copy)
    failed = run(["lmpipe", "retrain", "-S", "models.gru.optim.lr=1.0"], copy, env, check=False)
    assert failed.returncode == 1, failed.stdout[-2000:] + failed.stderr[-2000:]
    last = failed.stderr.strip().splitlines()[-1]
    assert last.startswith("error: retrain-") and "regressed beyond retrain.max_regression=0.05: gru word ppl" in last
    assert "nothing applied" in last and "lstm" not in last, last  # only the crippled model regressed
    assert workspace(copy) == before and champions(copy) == crowned
    said = failed.stdout + failed.stderr
    assert "stage train@gru" in said and re.search(r"gru epoch \d+\.\d+/", said), said[-3000:]  # progress as it runs
    name = last.split()[1]
    shown = run(["dvc", "exp", "show", "--json"], copy, env).stdout
    assert name in shown  # the failed experiment stays for inspection
    assert newest_flow_run_state(prefect_api, "retrain") == "FAILED"
    tags = retrain_runs(copy)[0].data.tags
    assert tags["lmpipe.retrain.decision"] == "failed" and tags["lmpipe.retrain.regressed"] == "gru"
    assert tags["lmpipe.retrain.experiment"] == name and has_row(tags["lmpipe.retrain.comparison"], "gru **regressed**")
    client = MlflowClient(f"sqlite:///{copy / 'mlflow.db'}")
    challenger = client.get_model_version_by_alias("lmpipe-gru", "challenger")
    assert challenger.tags["dvc.exp"] == name and str(challenger.version) != crowned["gru"]


@pytest.mark.slow
def test_a_retrain_on_a_changed_corpus_that_holds_level_is_committed_and_crowned(committed, prefect_api, tmp_path):
    """(a) The source's corpus changes: the experiment passes the gate, is applied in one commit, and its models
    become the champions."""
    import bz2

    from lmpipe.corpus.sources import ENWIKI_SAMPLE

    copy, env = committed
    dump = tmp_path / "enwiki.xml.bz2"
    shutil.copyfile(ENWIKI_SAMPLE, dump)
    override(copy / "params.yaml", {"corpus": {"source": "wikipedia-dump", "url": str(dump)}})
    run(["dvc", "repro"], copy, env)  # the same articles from a dump file: only download and prepare run
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    run(git + ["commit", "-qam", "the corpus from a dump file"], copy, env)
    before, crowned = workspace(copy), champions(copy)
    text = bz2.decompress(dump.read_bytes())
    edited = text.replace(b"Parents usually notice signs", b"Parents often notice signs", 1)  # a training article
    assert edited != text
    dump.write_bytes(bz2.compress(edited))

    done = run(["lmpipe", "retrain"], copy, env)
    after = workspace(copy)
    assert after["status"] == ""  # applied and committed: nothing left over
    log = run(["git", "log", "--format=%H%n%B", "-n", "1"], copy, env).stdout
    assert log.startswith(after["head"]) and after["head"] != before["head"]
    parent = run(["git", "rev-parse", "HEAD~1"], copy, env).stdout.strip()
    assert parent == before["head"]  # one commit on top
    assert "retrained within retrain.max_regression=0.05" in log and "- gru word ppl" in log, log
    pinned = yaml.safe_load((copy / "params.yaml").read_text())["corpus"]["sha256"]
    assert pinned == hashlib.sha256(dump.read_bytes()).hexdigest()  # the commit names the corpus it trained on
    assert after["models"] != before["models"] and after["eval"] != before["eval"]
    crowned_now = champions(copy)
    assert all(int(crowned_now[m]) > int(crowned[m]) for m in MODELS), (crowned, crowned_now)
    client = MlflowClient(f"sqlite:///{copy / 'mlflow.db'}")
    for m in MODELS:  # the champion is the model the workspace holds
        version = client.get_model_version_by_alias(f"lmpipe-{m}", "champion")
        assert version.tags["lmpipe.output_sha256"] == after["models"][m]
        assert client.get_run(version.run_id).data.tags["lmpipe.stage"] == f"score@{m}"  # registered where scored
    tags = retrain_runs(copy)[0].data.tags
    assert tags["lmpipe.retrain.decision"] == "passed" and tags["lmpipe.retrain.commit"] == after["head"]
    assert newest_flow_run_state(prefect_api, "retrain") == "COMPLETED"
    assert json.loads(run(["dvc", "status", "--json", "dvc.yaml"], copy, env).stdout) == {}
    closing = done.stdout.strip().splitlines()[-1]
    assert re.fullmatch(rf"applied retrain-\S+ as commit {after['head'][:12]}; champions: .*gru v\d+.*", closing), closing
    diff = run(["git", "diff", "-U0", "HEAD~1", "HEAD", "--", "params.yaml"], copy, env).stdout
    changed_lines = [l for l in diff.splitlines() if l[:1] in "+-" and l[:3] not in ("+++", "---")]
    assert len(changed_lines) == 2 and changed_lines[1].startswith(f"+  sha256: {pinned}"), diff  # one value, in place


@pytest.mark.slow
def test_a_retrain_that_passes_while_the_user_edits_applies_nothing_and_keeps_the_edits(committed, prefect_api):
    """README.md and params.yaml edited while the experiment runs: the retrain passes its gate, but applying would
    write over the edits (DVC keeps them only in a hidden stash), so it applies nothing, keeps the experiment, and
    says in one line how to apply it later."""
    copy, env = committed
    before, crowned = workspace(copy), champions(copy)
    retrain = subprocess.Popen(["lmpipe", "retrain", "-S", "models.gru.optim.lr=0.0011"], cwd=copy, env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # 1e-3 before: a model that holds
    lines = []
    for line in retrain.stdout:
        lines.append(line)
        if "stage train@gru" in line:  # the experiment runs in its copy: the user edits the workspace meanwhile
            break
    readme = (copy / "README.md").read_text() + "\nA note of the user's.\n"
    (copy / "README.md").write_text(readme)
    params = (copy / "params.yaml").read_text().replace("max_regression: 0.05", "max_regression: 0.06", 1)
    assert "max_regression: 0.06" in params
    (copy / "params.yaml").write_text(params)
    rest, _ = retrain.communicate(timeout=600)
    said = "".join(lines) + rest
    assert retrain.returncode == 0, said[-3000:]
    last = [line for line in said.splitlines() if line and not PREFECT_LOG.match(line)][-1]  # Prefect logs after it
    name = last.split()[0]
    assert last == (f"{name} passed but is not applied: README.md, params.yaml changed while it ran, and those changes "
                    f"stay as they are; the experiment stays: once they are committed or stashed, `dvc exp apply "
                    f"{name}` and a commit apply it"), said[-3000:]
    assert (copy / "README.md").read_text() == readme and (copy / "params.yaml").read_text() == params
    after = workspace(copy)
    assert after["head"] == before["head"] and after["models"] == before["models"] and after["eval"] == before["eval"]
    assert after["lock"] == before["lock"] and champions(copy) == crowned
    assert run(["git", "stash", "list"], copy, env).stdout == ""  # nothing hidden away
    assert name in run(["dvc", "exp", "show", "--json"], copy, env).stdout  # there to apply later
    tags = retrain_runs(copy)[0].data.tags
    assert tags["lmpipe.retrain.decision"] == "passed, not applied: workspace changed"
    assert newest_flow_run_state(prefect_api, "retrain") == "COMPLETED"


@pytest.mark.slow
@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_ctrl_c_or_sigterm_stops_a_retrain_removes_its_copy_and_says_how_to_resume(committed, prefect_api, how):
    """Ctrl-C in the terminal (SIGINT to the foreground group), or SIGTERM to `lmpipe retrain` alone (`kill`, a
    service manager), while a model trains in the experiment's copy: the same clean stop either way."""
    import signal
    import time

    copy, env = committed
    before = workspace(copy)
    retrain = subprocess.Popen(["lmpipe", "retrain", "-S", "models.gru.epochs=100000",
                                "-S", "models.gru.patience=100000"],
                               cwd=copy, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               start_new_session=True, preexec_fn=as_in_a_terminal)  # its own group, as a terminal's
    lines, deadline = [], time.monotonic() + 300
    for line in retrain.stdout:  # until the model trains: progress is said as it runs
        lines.append(line)
        if re.search(r"gru epoch \d+\.\d+/", line) or time.monotonic() > deadline:
            break
    assert any("stage train@gru" in l for l in lines), "".join(lines)[-3000:]
    assert list((copy / ".dvc/tmp/exps").glob("standalone/tmp*"))  # the experiment's temporary copy, while it runs
    assert list((copy / ".dvc/tmp/exps").glob("run/*"))  # and its run info
    if how == "ctrl-c":
        os.killpg(retrain.pid, signal.SIGINT)
    else:
        retrain.send_signal(signal.SIGTERM)
    rest, _ = retrain.communicate(timeout=120)
    said = "".join(lines) + rest
    assert retrain.returncode == 1, said[-3000:]
    last = said.strip().splitlines()[-1]
    assert last == ("error: retrain interrupted: nothing is applied and no temporary copy is left; run the same "
                    "`lmpipe retrain` again: DVC's run cache restores every stage that finished"), said[-3000:]
    assert "Traceback" not in said
    assert not list((copy / ".dvc/tmp/exps").glob("standalone/tmp*")) and not list((copy / ".dvc/tmp/exps").glob("run/*"))
    assert workspace(copy) == before
    newest = retrain_runs(copy)[0]
    assert newest.info.status == "KILLED" and newest.data.tags["lmpipe.retrain.decision"] == "interrupted"
    assert newest_flow_run_state(prefect_api, "retrain") == "CANCELLED"


@pytest.mark.slow
def test_sigterm_stops_a_scheduled_retrain_as_ctrl_c_does(committed, prefect_api):
    """What systemd, supervisord and Docker send: SIGTERM to `lmpipe schedule` alone while its retrain trains. It exits
    within 30 s, leaves no temporary copy, and no MLflow run or Prefect flow run stays RUNNING. Started as `nohup ... &`
    starts it, with SIGINT ignored: its retrain, which it stops by SIGINT, must not inherit that."""
    import signal
    import time

    copy, env = committed
    params = copy / "params.yaml"
    endless = yaml.safe_load(params.read_text())
    endless["models"]["gru"]["epochs"] = 100000
    endless["models"]["gru"]["patience"] = 100000
    endless["models"]["gru"]["max_steps_per_epoch"] = None
    params.write_text(yaml.safe_dump(endless, sort_keys=False))
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    run(git + ["commit", "-qam", "a long gru"], copy, env)  # the retrain needs a clean tree; DVC then retrains gru
    log = open(copy / "schedule.log", "wb")
    serve = subprocess.Popen(["lmpipe", "schedule", "--interval", "15", "--name", "e2e-sigterm"], cwd=copy, env=env,
                             stdout=log, stderr=subprocess.STDOUT, start_new_session=True,  # as `nohup ... &` starts
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))  # it: Ctrl-C ignored
    try:
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline and not list((copy / ".dvc/tmp/exps").glob("standalone/tmp*/.cache/lmpipe/ckpt/gru-*/last.pt")) \
                and not list((copy / ".cache/lmpipe/ckpt").glob("gru-*/last.pt")):
            assert serve.poll() is None, (copy / "schedule.log").read_text()[-3000:]
            time.sleep(1)
        assert time.monotonic() < deadline, (copy / "schedule.log").read_text()[-3000:]
        asked = time.monotonic()
        serve.send_signal(signal.SIGTERM)
        try:
            serve.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail("still running 30 s after SIGTERM:\n" + (copy / "schedule.log").read_text()[-6000:])
        assert time.monotonic() - asked <= 30
    finally:
        if serve.poll() is None:
            stop(serve)
        log.close()
    said = (copy / "schedule.log").read_text()
    assert "stopped serving 'retrain/e2e-sigterm'" in said, said[-3000:]
    time.sleep(2)  # what the stopped processes said on their way out reaches the stores
    assert not list((copy / ".dvc/tmp/exps").glob("standalone/tmp*")), said[-3000:]
    assert retrain_runs(copy)[0].info.status == "KILLED"
    client = MlflowClient(f"sqlite:///{copy / 'mlflow.db'}")
    running = client.search_runs([client.get_experiment_by_name("lmpipe").experiment_id], "attributes.status = 'RUNNING'")
    assert not running, [r.data.tags.get("lmpipe.stage") for r in running]
    runs = ask_prefect("POST", f"{prefect_api}/flow_runs/filter", json={
        "deployments": {"name": {"any_": ["e2e-sigterm"]}}}).json()
    assert runs and not [r for r in runs if r["state_type"] in ("RUNNING", "PENDING")], [r["state"] for r in runs]
    for deployment in ask_prefect("POST", f"{prefect_api}/deployments/filter",
                                  json={"deployments": {"name": {"any_": ["e2e-sigterm"]}}}).json():
        ask_prefect("DELETE", f"{prefect_api}/deployments/{deployment['id']}")


@pytest.mark.slow
def test_a_schedule_on_a_tree_a_reproduction_changed_fails_once_and_says_how_to_fix_it(committed, prefect_api):
    """A reproduction on another CPU left dvc.lock and metrics/weat.json changed: the first firing fails with the
    command that fixes it, in its Prefect state message and in `lmpipe schedule`'s output, and the schedule pauses
    instead of failing at every firing."""
    import time

    copy, env = committed
    for name in ("dvc.lock", "metrics/weat.json"):
        (copy / name).write_text((copy / name).read_text() + "\n")
    log = open(copy / "schedule.log", "wb")
    serve = subprocess.Popen(["lmpipe", "schedule", "--interval", "10", "--name", "e2e-dirty"], cwd=copy, env=env,
                             stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline, failed = time.monotonic() + 300, []
        while not failed and time.monotonic() < deadline:
            runs = ask_prefect("POST", f"{prefect_api}/flow_runs/filter", json={
                "deployments": {"name": {"any_": ["e2e-dirty"]}}}).json()
            failed = [r for r in runs if r["state_type"] == "FAILED"]
            time.sleep(2)
        assert failed, (copy / "schedule.log").read_text()[-3000:]
        time.sleep(25)  # two more intervals: a paused schedule fires no more
        runs = ask_prefect("POST", f"{prefect_api}/flow_runs/filter", json={
            "deployments": {"name": {"any_": ["e2e-dirty"]}}}).json()
        (deployment,) = ask_prefect("POST", f"{prefect_api}/deployments/filter",
                                    json={"deployments": {"name": {"any_": ["e2e-dirty"]}}}).json()
    finally:
        stop(serve)
        log.close()
    assert [r["state_type"] for r in runs if r["state_type"] in ("FAILED", "COMPLETED", "RUNNING")] == ["FAILED"]
    assert deployment["paused"]
    message = failed[0]["state"]["message"]
    assert "`git checkout -- dvc.lock metrics/weat.json`" in message and "is paused" in message, message
    assert "`git checkout -- dvc.lock metrics/weat.json`" in (copy / "schedule.log").read_text()
    ask_prefect("DELETE", f"{prefect_api}/deployments/{deployment['id']}")
