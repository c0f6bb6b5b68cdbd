"""Failures and recovery on a copy of the studied project: bad params, interrupted or failed stages, a corrupt model
and `lmpipe restore`, each said in one line."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys

import pytest
import yaml
from mlflow.tracking import MlflowClient

from lmpipe.io import sha256_tree

from tests.helpers import ADAMW, QuietHandler, as_in_a_terminal, http_server, override, run

pytestmark = pytest.mark.e2e
# `make test` runs on pytest-xdist's workers (tests/conftest.py): these tests form a group of their own,
# which a second worker runs beside a second copy of the study.
SECOND_STUDY = ("test_a_failure_after_training_keeps_the_training_and_the_rerun_does_not_train_again",)


def test_malformed_params_fail_in_one_line(scratch):  # its own copy: it edits params.yaml
    copy, env = scratch
    params = copy / "params.yaml"
    saved = params.read_text()
    try:
        params.write_text(saved + "\ncorpus: [broken\n")
        done = run([sys.executable, "-m", "flows.download"], copy, env, check=False)
        assert done.returncode == 1
        assert "Traceback" not in done.stderr
        assert done.stderr.strip().splitlines()[-1].startswith("error: params.yaml: malformed YAML at line")
        params.write_text(saved.replace("source: enwiki-sample", "source: gutenberg"))
        done = run([sys.executable, "-m", "flows.download"], copy, env, check=False)
        assert done.returncode == 1 and "corpus.source: Input should be" in done.stderr
    finally:
        params.write_text(saved)


def test_a_params_typo_under_dvc_says_how_to_restore_and_the_fixed_rerun_does_not_retrain(committed):
    """`dvc repro` itself (not make study, which checks params.yaml first): DVC removes the stage's outputs, the stage
    fails in one line naming `lmpipe restore <stage>`, which brings them back byte for byte (DVC's cache for the
    model, git for its metrics and curve); after the fix nothing trains again."""
    copy, env = committed
    outputs = [copy / "models/gru", copy / "metrics/train/gru.json", copy / "plots/train/gru.csv"]
    before = {o: sha256_tree(o) for o in outputs}
    params = copy / "params.yaml"
    saved = params.read_text()
    typo = yaml.safe_load(saved)
    typo["models"]["gru"]["epochs"] = -5
    params.write_text(yaml.safe_dump(typo, sort_keys=False))
    failed = run(["dvc", "repro", "train@gru"], copy, env, check=False)
    assert failed.returncode != 0
    line = next(l for l in failed.stderr.splitlines() if l.startswith("error: "))
    assert "models.gru.epochs" in line and line.endswith(
        "(DVC removed this stage's outputs before it ran; `lmpipe restore train@gru` brings them back)"), line
    assert "Traceback" not in failed.stderr and failed.stderr.count(line) == 1  # said once
    assert not any(o.exists() for o in outputs)
    restored = run(["lmpipe", "restore", "train@gru"], copy, env)
    assert restored.stdout.strip() == ("restored train@gru from the run dvc.lock records: models/gru, "
                                       "metrics/train/gru.json, plots/train/gru.csv")
    assert {o: sha256_tree(o) for o in outputs} == before
    params.write_text(saved)
    rerun = run(["dvc", "repro", "train@gru"], copy, env)
    assert "Running stage 'train@gru'" not in rerun.stdout and " epoch " not in rerun.stdout + rerun.stderr
    assert {o: sha256_tree(o) for o in outputs} == before
    assert run(["git", "status", "--porcelain"], copy, env).stdout == ""


def test_restore_after_an_uncommitted_run_gives_the_commits_model_with_the_commits_metrics(committed):
    """A run DVC recorded but nobody committed, then a failed run that removed its outputs: the model cannot come back
    from that run with its metrics (they were never in git), so the commit's pair comes back, and the line says so."""
    copy, env = committed
    outputs = [copy / "models/gru", copy / "metrics/train/gru.json", copy / "plots/train/gru.csv"]
    before = {o: sha256_tree(o) for o in outputs}
    params = copy / "params.yaml"
    other = yaml.safe_load(params.read_text())
    other["models"]["gru"]["arch"]["emb"] = 8
    params.write_text(yaml.safe_dump(other, sort_keys=False))
    run(["dvc", "repro", "train@gru"], copy, env)  # another model, uncommitted
    assert sha256_tree(copy / "models/gru") != before[copy / "models/gru"]
    for o in outputs:  # what DVC does before it runs the stage again
        shutil.rmtree(o) if o.is_dir() else o.unlink()
    restored = run(["lmpipe", "restore", "train@gru"], copy, env)
    assert restored.stdout.strip().startswith("restored train@gru from the commit (HEAD): the run dvc.lock recorded "
                                              "since was not committed"), restored.stdout
    assert {o: sha256_tree(o) for o in outputs} == before  # model and metrics of one run: the commit's
    assert run(["dvc", "status", "train@gru"], copy, env).stdout.strip() != "Data and pipelines are up to date."  # params changed
    params.write_text(run(["git", "show", "HEAD:params.yaml"], copy, env).stdout)
    assert run(["git", "status", "--porcelain"], copy, env).stdout == ""  # dvc.lock records the commit's run again


def test_restore_never_deletes_this_machines_run_when_the_commits_outputs_are_not_in_its_cache(committed):
    """A clone whose study ran here and is not committed, the commit's outputs made on another machine (not in this
    cache): a restore changes nothing, with outputs as dvc.lock records them or after a failed run removed them;
    the failed stage does not recommend it."""
    copy, env = committed
    params = copy / "params.yaml"
    saved = params.read_text()
    other = yaml.safe_load(saved)
    other["models"]["gru"]["arch"]["emb"] = 8
    params.write_text(yaml.safe_dump(other, sort_keys=False))
    run(["dvc", "repro", "train@gru"], copy, env)  # this machine's run, uncommitted
    committed_run = yaml.safe_load(run(["git", "show", "HEAD:dvc.lock"], copy, env).stdout)["stages"]["train@gru"]
    model = next(o["md5"] for o in committed_run["outs"] if o["path"] == "models/gru")
    (copy / ".dvc/cache/files/md5" / model[:2] / model[2:]).unlink()  # the commit's model: another machine's

    def files() -> dict:
        return {p.relative_to(copy).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in copy.rglob("*")
                if p.is_file() and not p.relative_to(copy).as_posix().startswith((".git/", ".dvc/tmp/"))}

    before = files()
    kept = run(["lmpipe", "restore", "train@gru"], copy, env)
    assert kept.stdout.strip() == "nothing to restore: train@gru's outputs are as dvc.lock records them"
    assert files() == before
    typo = yaml.safe_load(params.read_text())
    typo["models"]["gru"]["epochs"] = -5
    params.write_text(yaml.safe_dump(typo, sort_keys=False))
    failed = run(["dvc", "repro", "train@gru"], copy, env, check=False)
    line = next(l for l in failed.stderr.splitlines() if l.startswith("error: "))
    assert failed.returncode != 0 and "models.gru.epochs" in line and "lmpipe restore" not in line, line
    params.write_text(yaml.safe_dump(other, sort_keys=False))
    assert not (copy / "models/gru").exists() and not (copy / "metrics/train/gru.json").exists()
    before = files()
    refused = run(["lmpipe", "restore", "train@gru"], copy, env, check=False)
    assert refused.returncode == 1 and refused.stderr.strip().splitlines() == [
        "error: train@gru: nothing restored, nothing changed: models/gru of HEAD's run is not in this cache, and "
        "metrics/train/gru.json, plots/train/gru.csv of the run dvc.lock records are in no commit; `dvc pull "
        "train@gru` fetches HEAD's from a DVC remote that has them, or `dvc repro -s train@gru` makes them again"]
    assert files() == before  # dvc.lock and every file byte for byte


def test_ctrl_c_stops_a_training_stage_in_one_line_and_its_run_ends_killed(scratch):  # its own copy: it edits params.yaml
    import re
    import signal
    import time

    copy, env = scratch
    params = copy / "params.yaml"
    endless = yaml.safe_load(params.read_text())
    endless["models"]["gru"]["epochs"] = 100000
    endless["train"]["checkpoint_every"] = 10  # a first checkpoint within seconds, even on a loaded fp32 machine
    params.write_text(yaml.safe_dump(endless, sort_keys=False))
    started = time.time()
    stage = subprocess.Popen([sys.executable, "-m", "flows.train", "--model", "gru"], cwd=copy, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=as_in_a_terminal)
    def checkpointed():  # this run's own first checkpoint, not one an earlier run left behind
        return any(p.stat().st_mtime >= started for p in (copy / ".cache/lmpipe/ckpt").glob("gru-*/last.pt"))

    deadline = time.monotonic() + 300
    while not checkpointed() and time.monotonic() < deadline:
        time.sleep(0.5)  # training has reached its first checkpoint
    reached = checkpointed()
    stage.send_signal(signal.SIGINT)
    out, err = stage.communicate(timeout=60)
    assert reached, f"no checkpoint within 300 s: the stage never reached training\n{err[-2000:]}"
    assert stage.returncode == 1
    assert "Traceback" not in out + err and "Crash detected" not in out + err
    assert re.fullmatch(r"gru interrupted at step \d+; checkpoint saved; `dvc repro` resumes",
                        err.strip().splitlines()[-1]), err[-2000:]
    client = MlflowClient(f"sqlite:///{copy / 'mlflow.db'}")
    newest = client.search_runs([client.get_experiment_by_name("lmpipe").experiment_id],
                                "tags.`lmpipe.stage` = 'train@gru'", order_by=["attributes.start_time DESC"])[0]
    assert newest.info.status == "KILLED"


class NotFound(QuietHandler):
    hits = 0

    def do_GET(self):
        NotFound.hits += 1
        self.send_error(404, "Not Found")


def test_404_in_the_flow_is_one_clear_line_and_not_retried(scratch):  # its own copy: it edits params.yaml
    copy, env = scratch
    params = copy / "params.yaml"
    saved = params.read_text()
    with http_server(NotFound) as base:
        url = f"{base}/enwiki-latest.xml.bz2"
        override(params, {"corpus": {"source": "wikipedia-dump", "url": url}})
        done = run([sys.executable, "-m", "flows.download"], copy, env, check=False)
        assert done.returncode == 1
        assert "Traceback" not in done.stderr + done.stdout
        assert done.stderr.strip().splitlines()[-1] == f"error: {url}: HTTP 404 Not Found (check corpus.url / the source's URL)"
        assert NotFound.hits == 1
    params.write_text(saved)


FAIL_AT_TRACKING = """
import flows.train as stage
def unavailable(*args, **kwargs):
    raise RuntimeError("the tracking store is unavailable")
stage.tracking.mark_output = unavailable
stage.main(stage.train, model="gru")
"""


@pytest.mark.slow
def test_a_failure_after_training_keeps_the_training_and_the_rerun_does_not_train_again(scratch):
    copy, env = scratch
    run(["dvc", "repro", "--force", "train@gru"], copy, env)  # an uninterrupted run here
    ours = (copy / "models/gru/model.pt").read_bytes()
    failed = subprocess.run([sys.executable, "-c", FAIL_AT_TRACKING], cwd=copy, env=env, capture_output=True,
                            text=True, timeout=600)
    assert failed.returncode != 0 and "tracking store is unavailable" in failed.stderr
    assert "gru epoch 1.00/1" in failed.stderr + failed.stdout  # it trained
    assert list((copy / ".cache/lmpipe/ckpt").glob("gru-*/last.pt"))  # and kept what it trained
    # --force: the stage itself runs (DVC would otherwise restore the fixture's cached outputs of this very stage)
    again = run(["dvc", "repro", "--force", "train@gru"], copy, env)
    assert "Running stage 'train@gru'" in again.stdout
    assert "gru epoch" not in again.stdout + again.stderr  # resumed finished: not one step trained or evaluated again
    assert (copy / "models/gru/model.pt").read_bytes() == ours  # the very model an uninterrupted run gives
    assert not list((copy / ".cache/lmpipe/ckpt").glob("gru-*"))  # discarded once every output was written


def test_a_corrupt_model_file_is_one_line_naming_it_and_dvc_checkout_restores_it(scratch):
    copy, env = scratch
    (copy / "models/gru/model.pt").write_bytes(b"not a model")
    broken = run(["lmpipe", "generate", "--model", "gru", "--prompt", "The history of"], copy, env, check=False)
    assert broken.returncode != 0
    loading, *lines = broken.stderr.strip().splitlines()  # what it loads, then the error in one line
    assert loading == "loading models/gru ..."
    assert len(lines) == 1 and "models/gru/model.pt" in lines[0] and "dvc checkout --force train@gru" in lines[0]
    run(["dvc", "checkout", "--force", "train@gru"], copy, env)
    assert run(["lmpipe", "generate", "--model", "gru", "--prompt", "The history of"], copy, env).stdout.strip()


@pytest.mark.slow
def test_changed_training_code_starts_afresh_and_equals_a_clean_run_of_the_new_code(scratch):
    """The probe: a run killed after its first checkpoint, then a real change to lmpipe/muon.py (the GRU's
    optimiser), then the stage again: it starts from step 0 (the old code's checkpoint is not resumed) and gives the
    model a clean run of the new code gives, byte for byte."""
    import signal
    import time

    copy, env = scratch
    params = yaml.safe_load((copy / "params.yaml").read_text())
    params["train"]["checkpoint_every"] = 4
    params["models"]["gru"] = {**params["models"]["gru"], "max_steps_per_epoch": 200,  # seconds past the first
                               "optim": {**ADAMW, "name": "muon", "lr": 0.02}}      # checkpoint, not a race with it
    (copy / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    ckpts = copy / ".cache/lmpipe/ckpt"
    started = time.time()
    stage = subprocess.Popen([sys.executable, "-m", "flows.train", "--model", "gru"], cwd=copy, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=as_in_a_terminal)
    deadline = time.monotonic() + 300
    while not any(p.stat().st_mtime >= started for p in ckpts.glob("gru-*/last.pt")) and time.monotonic() < deadline:
        time.sleep(0.05)
    stage.send_signal(signal.SIGINT)
    stage.communicate(timeout=60)
    (old,) = [p.parent for p in ckpts.glob("gru-*/last.pt")]
    killed_at = old.joinpath("last.pt").stat().st_mtime
    muon = copy / "lmpipe/muon.py"
    source = muon.read_text()
    assert "for _ in range(steps):" in source
    muon.write_text(source.replace("for _ in range(steps):", "for _ in range(steps - 1):"))  # one Newton-Schulz step less
    new_code = run([sys.executable, "-m", "flows.train", "--model", "gru"], copy, env)
    assert "resuming gru" not in new_code.stderr + new_code.stdout  # from step 0
    assert old.joinpath("last.pt").stat().st_mtime == killed_at  # the old code's run, untouched
    first = (copy / "models/gru/model.pt").read_bytes()
    shutil.rmtree(ckpts)
    run([sys.executable, "-m", "flows.train", "--model", "gru"], copy, env)  # a clean run of the new code
    assert (copy / "models/gru/model.pt").read_bytes() == first
