"""MLflow runs: one per stage, nested under one study run found across processes."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from lmpipe import tracking


@pytest.fixture()
def store(mlflow_store, tmp_path):
    """The test's own MLflow store, and a params.yaml naming only the corpus (what the study run's name reads)."""
    params = tmp_path / "params.yaml"
    params.write_text("corpus: {source: enwiki-sample}\n")
    return mlflow_store, params


def test_stages_nest_under_one_study_run(store):
    uri, params = store
    with tracking.runs.open_stage_run("download", "exp", {"corpus": {"source": "x", "url": None}}, "h1",
                                      params_file=params):
        tracking.log_metrics({"splits": {"train": {"words": 10}}, "source": "text", "ok": True})
    with tracking.runs.open_stage_run("prepare", "exp", {"split": {"seed": 1}}, "h2", params_file=params):
        pass
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("exp")
    runs = client.search_runs([exp.experiment_id])
    studies = [r for r in runs if r.data.tags.get("lmpipe.role") == "study"]
    stages = {r.data.tags["lmpipe.stage"]: r for r in runs if r.data.tags.get("lmpipe.role") == "stage"}
    assert len(studies) == 1 and studies[0].info.status == "FINISHED"
    assert set(stages) == {"download", "prepare"}
    for run in stages.values():
        assert run.data.tags["mlflow.parentRunId"] == studies[0].info.run_id
    download = stages["download"]
    assert download.data.params == {"corpus.source": "x", "corpus.url": "null"}
    assert download.data.metrics == {"splits.train.words": 10.0}
    assert download.data.tags["lmpipe.params_hash"] == "h1"
    assert exp.artifact_location.endswith("/mlartifacts")


def test_changed_params_start_a_new_study(store):
    uri, params = store
    with tracking.runs.open_stage_run("download", "exp", {}, "h", params_file=params):
        pass
    params.write_text("corpus: {source: wikitext-2}\n")
    with tracking.runs.open_stage_run("download", "exp", {}, "h", params_file=params):
        pass
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("exp")
    studies = client.search_runs([exp.experiment_id], "tags.`lmpipe.role` = 'study'")
    assert len(studies) == 2


def test_parent_from_environment_wins(store, monkeypatch):
    uri, params = store
    client = MlflowClient(uri)
    exp_id = tracking.tracker().experiment_id("exp")
    parent = client.create_run(exp_id).info.run_id
    monkeypatch.setenv("LMPIPE_PARENT_RUN_ID", parent)
    with tracking.runs.open_stage_run("tokenize", "exp", {}, "h", params_file=params) as run:
        run_id = run.info.run_id
    assert client.get_run(run_id).data.tags["mlflow.parentRunId"] == parent


def test_default_uri_follows_dvc_root(monkeypatch, tmp_path):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    assert tracking.store.tracking_uri() == f"sqlite:///{tmp_path}/mlflow.db"


def test_a_taken_port_is_one_line_not_a_server_that_never_answers():
    from lmpipe_cli import server
    from lmpipe.errors import LmpipeError
    from tests.helpers import taken_port

    with taken_port() as port:
        with pytest.raises(LmpipeError, match=rf"^127.0.0.1:{port} is taken by another program \(choose another: "
                                              r"lmpipe server --port N\)$"):
            server.start(port, timeout=5)


def test_the_first_version_is_the_champion_and_every_new_one_the_challenger(store, monkeypatch):
    """Only a passing retrain may move the champion: a later study version, or an experiment's, is a challenger."""
    client = tracking.tracker().client  # the store of MLFLOW_TRACKING_URI
    client.create_registered_model("lmpipe-x")
    for version in ("1", "2"):
        client.create_model_version("lmpipe-x", source=f"file:///nowhere/{version}")
        tracking.registry.name_aliases(client, "lmpipe-x", version)
    monkeypatch.setenv("DVC_EXP_NAME", "lanky-bass")
    client.create_model_version("lmpipe-x", source="file:///nowhere/3")
    tracking.registry.name_aliases(client, "lmpipe-x", "3")
    assert str(client.get_model_version_by_alias("lmpipe-x", "champion").version) == "1"
    assert str(client.get_model_version_by_alias("lmpipe-x", "challenger").version) == "3"
    assert client.get_model_version("lmpipe-x", "1").aliases == ["champion"]  # one alias a version, never both
    client.set_model_version_tag("lmpipe-x", "3", tracking.EXPERIMENT, "lanky-bass")
    assert tracking.registry.promote_experiment("other-exp") == {}  # another experiment's pass moves nothing here
    assert tracking.registry.promote_experiment("lanky-bass") == {"lmpipe-x": "3"}
    assert str(client.get_model_version_by_alias("lmpipe-x", "champion").version) == "3"
    assert client.get_model_version("lmpipe-x", "3").aliases == ["champion"]  # the challenger it was is promoted
    assert {m: str(v.version) for m, v in tracking.registry.champion_versions(["x", "missing"]).items()} == {"x": "3"}


def test_a_missing_version_and_a_version_whose_files_are_gone_are_told_apart(store, tmp_path):
    import mlflow
    from mlflow.tracking import MlflowClient

    from lmpipe.errors import TrackingError

    uri, _ = store
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment("registry")
    gone = tmp_path / "moved-away"  # where the version's files were: a moved checkout's old path
    with mlflow.start_run():
        (tmp_path / "note.txt").write_text("x")
        mlflow.log_artifact(str(tmp_path / "note.txt"), "model")
        run_id = mlflow.active_run().info.run_id
    client = MlflowClient()
    client.create_registered_model("lmpipe-x")
    client.create_model_version("lmpipe-x", source=str(gone), run_id=run_id)
    with pytest.raises(TrackingError, match=r"^models:/lmpipe-x/7: not in the MLflow model registry at sqlite:"):
        tracking.registry.registered_artifacts("models:/lmpipe-x/7")
    with pytest.raises(TrackingError, match=r"^models:/lmpipe-x/1: version 1 is registered, but its files are missing "):
        tracking.registry.registered_artifacts("models:/lmpipe-x/1")


def test_a_copied_store_finds_its_artifacts_in_its_own_folder(tmp_path, monkeypatch):
    """MLflow records artifact addresses absolute; a checkout copied elsewhere points them at its own mlartifacts/
    (prepare_store does it at every stage, the registry lookups too), and the original stays as it was."""
    import shutil

    import mlflow

    first, moved = tmp_path / "first", tmp_path / "moved"
    first.mkdir()
    monkeypatch.delenv("LMPIPE_PARENT_RUN_ID", raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{first / 'mlflow.db'}")
    tracking.store.prepare_store(10)
    with tracking.runs.run("lmpipe", "a run") as active:
        (tmp_path / "note.txt").write_text("kept")
        mlflow.log_artifact(str(tmp_path / "note.txt"))
    shutil.copytree(first, moved)
    shutil.rmtree(first / "mlartifacts")  # the copy must not read the original's files
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{moved / 'mlflow.db'}")
    tracking.store.prepare_store(10)
    mlflow.set_tracking_uri(f"sqlite:///{moved / 'mlflow.db'}")
    uri = MlflowClient().get_run(active.info.run_id).info.artifact_uri
    assert uri.startswith((moved / "mlartifacts").as_uri())
    assert open(mlflow.artifacts.download_artifacts(artifact_uri=f"{uri}/note.txt")).read() == "kept"
    assert tracking.store.relocate_store(moved / "mlflow.db") is None  # once is enough
    assert MlflowClient(f"sqlite:///{first / 'mlflow.db'}").get_run(active.info.run_id).info.artifact_uri.startswith((first / "mlartifacts").as_uri())


def test_a_run_that_makes_an_evaluated_model_again_carries_its_results_and_no_other_runs(store, monkeypatch, tmp_path):
    """DVC re-evaluates nothing when a retrain reproduces a model bit for bit: the new run takes over the results
    of the newest evaluated run of the same files; a different model's run gets none."""
    uri, params = store
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "models/gru"
    folder.mkdir(parents=True)
    (folder / "model.pt").write_text("weights")
    results = {"test_bpb": 1.96, "test_word_ppl": 5200.0}
    with tracking.runs.open_stage_run("train@gru", "exp", {}, "h", params_file=params) as first:
        tracking.mark_output(folder)
    tracking.log_metrics(results, run_id=first.info.run_id)  # what score logs onto the model's run
    with tracking.runs.open_stage_run("train@gru", "exp", {}, "h", params_file=params) as failed:  # never evaluated
        tracking.mark_output(folder)
    with tracking.runs.open_stage_run("train@gru", "exp", {}, "h", params_file=params) as again:
        tracking.mark_output(folder)
        tracking.carry_results(folder, again.info.run_id)
    carried = MlflowClient(uri).get_run(again.info.run_id).data
    assert {k: carried.metrics[k] for k in results} == results
    assert "test_bpb" not in MlflowClient(uri).get_run(failed.info.run_id).data.metrics
    (folder / "model.pt").write_text("other weights")  # a different model: nothing to carry
    with tracking.runs.open_stage_run("train@gru", "exp", {}, "h", params_file=params) as other:
        tracking.mark_output(folder)
        tracking.carry_results(folder, other.info.run_id)
    assert "test_bpb" not in MlflowClient(uri).get_run(other.info.run_id).data.metrics
