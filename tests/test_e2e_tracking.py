"""What the study records, on its tiny copy: a run per stage in MLflow and a flow run in Prefect, the registered
models and the views over them, kept when a checkout moves or a store lacks the runs of skipped stages."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import requests
from mlflow.tracking import MlflowClient

from lmpipe.io import sha256_tree

from tests.helpers import (MODELS, STAGES, ask_prefect, assert_best_first, browser, leaderboard_page, ran_stages, run,
                           stages_in_order, stop, workspace)

pytestmark = pytest.mark.e2e
# `make test` runs on pytest-xdist's workers (tests/conftest.py): these tests form a group of their own,
# which a second worker runs beside a second copy of the study.
SECOND_STUDY = ("test_a_fresh_clone_makes_the_runs_of_the_stages_whose_outputs_git_holds_and_nothing_else_changes",)


@pytest.mark.browser
@browser
def test_after_the_study_its_mlflow_views_and_registry_say_by_how_much(project, monkeypatch):
    """The study's own MLflow store, as `lmpipe ui` shows it in a browser: each of its six models once, best test
    bpb first, with the labels the publish stage wrote (test bpb, the gap to KN-5, size, FLOPs); the "every model so
    far" view holds each model once (not its scoring run too); each champion's version states its numbers."""

    copy, env, _ = project
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    results = {p.stem: json.loads(p.read_text())["test"]["bpb"] for p in sorted((copy / "metrics/eval").glob("*.json"))}
    assert sorted(results) == sorted([*MODELS, "ngram"])
    assert_best_first(leaderboard_page(copy), results)
    client = MlflowClient(f"sqlite:///{copy / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("lmpipe").experiment_id
    ranked = client.search_runs([experiment], "tags.`lmpipe.role` = 'published'")  # the publish stage's rows
    assert sorted(r.info.run_name for r in ranked) == sorted(["ngram", *MODELS])
    trained = client.search_runs([experiment], "tags.`lmpipe.stage` LIKE 'train@%'")
    assert not [r.info.run_name for r in trained if "test bpb" in r.data.tags]  # training runs as training left them
    for model in MODELS:
        version = client.get_model_version_by_alias(f"lmpipe-{model}", "champion")
        assert f"test {results[model]:.3f} (1 seed) bpb" in version.description and "Against KN-5: " in version.description
        assert version.tags["test_bpb"] == f"{results[model]:.4f}" and version.tags["params_sha256"]


def test_every_stage_is_an_mlflow_run_and_a_prefect_flow_run(project, prefect_api):
    copy, _, _ = project
    client = MlflowClient(f"sqlite:///{copy / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("lmpipe")
    runs = client.search_runs([experiment.experiment_id])
    stages = {r.data.tags["lmpipe.stage"]: r for r in runs if r.data.tags.get("lmpipe.role") == "stage"}
    studies = [r for r in runs if r.data.tags.get("lmpipe.role") == "study"]
    assert set(stages) == set(STAGES) and len(studies) == 1
    study = studies[0].info  # ended by the publish stage, the last: its duration spans the stages
    assert study.end_time >= max(r.info.end_time for r in stages.values() if r.data.tags["lmpipe.stage"] != "publish")
    assert {r.data.tags["mlflow.parentRunId"] for r in stages.values()} == {studies[0].info.run_id}
    assert stages["prepare"].data.params["corpus.max_articles"] == "12"
    assert stages["tokenize"].data.metrics["vocab_size"] == 600
    assert stages["validate"].data.metrics["passed"] == 1
    assert not list(copy.glob("models/*/mlflow_run.json"))  # no run ids inside DVC outputs
    assert stages["ngram"].data.tags["lmpipe.output_sha256"] == sha256_tree(copy / "models/ngram")
    assert stages["ngram"].data.tags["lmpipe.model"] == "ngram"
    assert {"valid_ppl", "test_ppl", "test_word_ppl", "test_bpb", "n_params", "tokens_per_sec"} <= set(
        stages["ngram"].data.metrics)  # the names every model's run shares, for MLflow's compare view
    axes = {"compute.params_m", "compute.tokens_m", "lm"}  # sorted first: the compare view's parallel coordinates
    for stage in ("ngram", *(f"train@{m}" for m in MODELS)):
        params = stages[stage].data.params
        assert sorted(params)[:3] == sorted(axes) and params["lm"] == stages[stage].data.tags["lmpipe.model"]
        assert float(params["compute.params_m"]) == pytest.approx(stages[stage].data.metrics["n_params"] / 1e6, abs=1e-3)
    for model in MODELS:
        trained = stages[f"train@{model}"]
        assert trained.data.tags["lmpipe.model"] == model
        assert {"valid_ppl", "tokens_per_sec", "n_params", "train_loss", "valid_word_ppl", "grad_norm", "lr"} <= set(
            trained.data.metrics)
        assert "system/cpu_utilization_percentage" in trained.data.metrics  # MLflow's system metrics
        assert trained.data.tags["lmpipe.output_sha256"] == sha256_tree(copy / f"models/{model}")
        versions = client.search_model_versions(f"name = 'lmpipe-{model}'")  # registered where it was scored
        assert [(v.run_id, v.tags["lmpipe.output_sha256"]) for v in versions] == [
            (stages[f"score@{model}"].info.run_id, trained.data.tags["lmpipe.output_sha256"])]
        assert {"test_ppl", "test_word_ppl", "test_bpb", "test_loss"} <= set(trained.data.metrics)  # by score@
        assert {"valid_ppl", "tokens_per_sec", "n_params"} <= set(trained.data.metrics)  # by the training itself
    study_artifacts = {a.path for a in client.list_artifacts(studies[0].info.run_id, "report")}
    assert {"report/study.md", "report/study.html"} <= study_artifacts
    for stage, mlflow_run in stages.items():
        flow_run = ask_prefect("GET", f"{prefect_api}/flow_runs/{mlflow_run.data.tags['prefect.flow_run_id']}")
        assert flow_run.status_code == 200
        assert flow_run.json()["state_type"] == "COMPLETED"
        flow = ask_prefect("GET", f"{prefect_api}/flows/{flow_run.json()['flow_id']}").json()
        assert flow["name"] == ("score" if stage == "score_ngram" else stage.split("@")[0])  # one flow scores any model
        assert flow_run.json()["name"] == stage  # every flow run is named after its stage (train@<model> too)
        assert f"study:{mlflow_run.data.tags['lmpipe.study_key']}" in flow_run.json()["tags"]


def test_registered_models_carry_a_signature_and_serve_through_pyfunc(project):
    copy, env, _ = project
    check = """
import json, mlflow, numpy as np, pandas as pd
mlflow.set_tracking_uri("sqlite:///mlflow.db")
info = mlflow.models.get_model_info("models:/lmpipe-lstm/1")
text = mlflow.pyfunc.load_model("models:/lmpipe-lstm/1").predict(pd.DataFrame({"prompt": ["The history of", "A"]}),
                                                                 params={"strategy": "greedy", "max_new_tokens": 4})
default = mlflow.pyfunc.load_model("models:/lmpipe-lstm/1").predict(pd.DataFrame({"prompt": ["The history of"]}),
                                                                    params={"strategy": "greedy"})
raw = f"runs:/{mlflow.MlflowClient().get_model_version('lmpipe-lstm', '1').run_id}/logits"
logits = mlflow.pyfunc.load_model(raw).predict(np.array([[5, 6, 7]], dtype=np.int64))
print(json.dumps({"signature": info.signature.to_dict(), "logits": mlflow.models.get_model_info(raw).signature.to_dict(),
                  "shape": list(logits.shape), "text": text["continuation"].tolist(),
                  "default": default["continuation"][0]}))
"""
    loaded = run([sys.executable, "-c", check], copy, env)
    assert "mismatch" not in loaded.stderr and "Warning" not in loaded.stderr, loaded.stderr[-2000:]
    out = json.loads(loaded.stdout.strip().splitlines()[-1])
    assert json.loads(out["signature"]["inputs"]) == [{"type": "string", "name": "prompt", "required": True}]
    assert json.loads(out["signature"]["outputs"]) == [{"type": "string", "name": "continuation", "required": True}]
    assert [p["name"] for p in json.loads(out["signature"]["params"])] == [  # every setting `generate` takes
        "strategy", "max_new_tokens", "temperature", "top_k", "top_p", "typical_p", "beam_size", "no_repeat_ngram", "seed"]
    assert len(out["text"]) == 2 and all(isinstance(t, str) and t for t in out["text"])
    inputs, outputs = json.loads(out["logits"]["inputs"]), json.loads(out["logits"]["outputs"])
    assert inputs == [{"type": "tensor", "tensor-spec": {"dtype": "int64", "shape": [-1, -1]}}]
    assert outputs == [{"type": "tensor", "tensor-spec": {"dtype": "float32", "shape": [-1, -1, 600]}}]
    assert out["shape"] == [1, 3, 600]  # next-token logits over the 600-piece vocabulary
    done = run(["lmpipe", "generate", "--model", "models:/lmpipe-lstm/1", "--prompt", "The history of",
                "--max-new-tokens", "5"], copy, env)
    assert done.stdout.startswith("The history of")
    # what a request leaves unset comes from params.yaml's `evaluate` (max_new_tokens 8 here), as in `lmpipe generate`
    local = run(["lmpipe", "generate", "--model", "lstm", "--prompt", "The history of", "--strategy", "greedy"], copy, env)
    assert local.stdout.rstrip("\n") == "The history of" + out["default"] and out["default"]
    client = MlflowClient(f"sqlite:///{copy / 'mlflow.db'}")
    for model in MODELS:  # the study's first versions are the champions, and nothing else: one alias a version
        assert client.get_model_version(f"lmpipe-{model}", "1").aliases == ["champion"]
    by_alias = run(["lmpipe", "generate", "--model", "models:/lmpipe-gru@champion", "--prompt", "The history of",
                    "--max-new-tokens", "5"], copy, env)
    assert by_alias.stdout.startswith("The history of")
    missing = run(["lmpipe", "generate", "--model", "models:/lmpipe-lstm/99", "--prompt", "The"], copy, env, check=False)
    assert missing.returncode == 1 and missing.stderr.strip().splitlines() == [
        "loading models:/lmpipe-lstm/99 from the MLflow registry ...",
        f"error: models:/lmpipe-lstm/99: not in the MLflow model registry at sqlite:///{copy}/mlflow.db "
        "(RESOURCE_DOES_NOT_EXIST; see the versions with `lmpipe ui`, Models)"]


def test_a_moved_checkout_keeps_its_artifacts_and_registry(project, tmp_path):
    """MLflow records artifact paths absolute; a project copied elsewhere (its original gone) still loads its
    registered models, from its own mlartifacts/."""
    copy, env, _ = project
    moved = tmp_path / "moved"
    shutil.copytree(copy, moved, symlinks=True)
    generate = ["lmpipe", "generate", "--model", "models:/lmpipe-gru/1", "--prompt", "The history of",
                "--strategy", "greedy", "--max-new-tokens", "6"]
    here = run(generate, copy, env).stdout
    hidden = copy.with_name(copy.name + "-away")
    copy.rename(hidden)  # nothing may be read from the original's folder
    try:
        there = run(generate, moved, env).stdout
    finally:
        hidden.rename(copy)
    assert there == here and there.startswith("The history of")


def test_mlflow_server_serves_every_stage_run(project):
    """`mlflow server` over the finished study's store: every stage's run, params and metrics over HTTP."""
    import time

    from tests.helpers import free_port

    copy, env, _ = project
    port = free_port()
    server = subprocess.Popen(["mlflow", "server", "--backend-store-uri", f"sqlite:///{copy / 'mlflow.db'}",
                               "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                              cwd=copy, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    base = f"http://127.0.0.1:{port}/api/2.0/mlflow"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                experiment = requests.get(f"{base}/experiments/get-by-name",
                                          params={"experiment_name": "lmpipe"}, timeout=5).json()["experiment"]
                break
            except (requests.ConnectionError, requests.Timeout, KeyError):  # still starting: its first answer can
                assert time.monotonic() < deadline, "mlflow server did not start"  # take seconds on 2 busy cores
                time.sleep(1)
        runs = requests.post(f"{base}/runs/search", json={"experiment_ids": [experiment["experiment_id"]],
                                                          "max_results": 500}, timeout=10).json()["runs"]
        by_stage = {}
        for r in runs:
            tags = {t["key"]: t["value"] for t in r["data"].get("tags", [])}
            if tags.get("lmpipe.role") == "stage":
                by_stage.setdefault(tags["lmpipe.stage"], r)
        assert set(STAGES) <= set(by_stage)
        lstm = by_stage["train@lstm"]["data"]
        assert {"valid_ppl", "test_word_ppl"} <= {m["key"] for m in lstm["metrics"]}
        assert any(p["key"] == "model.family" and p["value"] == "rnn" for p in lstm["params"])
    finally:
        stop(server)


@pytest.mark.slow
def test_a_model_retrained_bit_for_bit_keeps_its_test_results_in_mlflow(project, tmp_path):
    """DVC re-evaluates nothing when a retrained model hashes the same: its new run still shows the test numbers."""
    copy, env, _ = project
    target = tmp_path / "project"
    shutil.copytree(copy, target, symlinks=True)  # the MLflow store too: the evaluated run is in it
    before = sha256_tree(target / "models/gru")
    run(["dvc", "repro", "--force", "train@gru"], target, env)
    assert sha256_tree(target / "models/gru") == before  # bit for bit
    client = MlflowClient(f"sqlite:///{target / 'mlflow.db'}")
    newest = client.search_runs([client.get_experiment_by_name("lmpipe").experiment_id],
                                "tags.`lmpipe.stage` = 'train@gru'", order_by=["attributes.start_time DESC"])[0]
    assert newest.data.tags["lmpipe.output_sha256"] == before
    evaluated = json.loads((target / "metrics/eval.json").read_text())["models"]["gru"]["test"]
    assert {k: newest.data.metrics[f"test_{k}"] for k in evaluated} == evaluated
    assert newest.data.metrics["train_tflops"] > 0


@pytest.mark.slow
def test_a_fresh_clone_makes_the_runs_of_the_stages_whose_outputs_git_holds_and_nothing_else_changes(committed):
    """A fresh clone: a score's cached output is missing (and DVC has no run cache), its model scores to the committed
    bytes, and plain `dvc repro` would then skip evaluate, combine, report and publish, whose outputs git holds, so
    the clone's MLflow would lack their runs. `make study`'s `dvc repro --force-downstream` (lmpipe_cli/progress.py)
    runs them below the score: the same bytes come out, each stage has its run, and a second time nothing runs."""
    copy, env = committed
    client = MlflowClient(f"sqlite:///{copy / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("lmpipe").experiment_id
    skipped = ("evaluate", "combine", "report", "publish")
    for stage in skipped:  # the clone's store has the models' runs (they trained) but none of these
        for found in client.search_runs([experiment], f"tags.`lmpipe.stage` = '{stage}'"):
            client.delete_run(found.info.run_id)
    for row in client.search_runs([experiment], "tags.`lmpipe.role` = 'published'"):  # the publish stage's rows too
        client.delete_run(row.info.run_id)
    before = workspace(copy)
    (copy / "data/logprobs/gru.npz").unlink()  # not in git: a fresh clone makes it again
    shutil.rmtree(copy / ".dvc/cache/runs", ignore_errors=True)  # a fresh clone has no run cache to restore it from
    said = run([sys.executable, "-m", "lmpipe_cli.progress"], copy, env, timeout=900).stdout
    assert stages_in_order(said) == ["score@gru", *skipped], said
    assert workspace(copy) == before and run(["dvc", "status", "--json", "dvc.yaml"], copy, env).stdout.strip() == "{}"
    for stage in skipped:
        assert len(client.search_runs([experiment], f"tags.`lmpipe.stage` = '{stage}'")) == 1, stage
    rows = client.search_runs([experiment], "tags.`lmpipe.role` = 'published'")  # the views' rows, published again
    assert sorted(r.data.tags["lmpipe.model"] for r in rows) == sorted([*MODELS, "ngram"])
    assert all("test" in r.data.tags["mlflow.note.content"] for r in rows)
    assert ran_stages(run([sys.executable, "-m", "lmpipe_cli.progress"], copy, env, timeout=900).stdout) == set()
