"""The MLflow views `lmpipe ui` prints and the registry's cards, both the publish stage's: a row per model the
workspace holds, best test bpb first, with the labels a person reads; the runs that trained the models untouched."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from lmpipe import mlflow_views as views
from lmpipe import tracking
from tests.helpers import ROOT, assert_best_first, browser, leaderboard_page

# test bpb of each model: the neural ones and the n-gram, in an order that is neither the runs' nor the names'
RESULTS = {"gru": 1.9589, "nplm": 2.1947, "transformer": 1.9206, "ngram": 2.0485, "rnn": 2.0491, "lstm": 1.9563}
SEEDS = ("model,seed,valid_bpb,test_bpb,test_word_ppl,precision,identity,machine\n"  # the study's run and two more
         "gru,1234,2.01,1.9589,5200.0,,made-so,\ngru,1,2.02,1.9600,5210.0,,made-so,\ngru,2,2.00,1.9540,5150.0,,made-so,\n")


def trained_models(root: Path, params: Path, results: dict) -> dict:
    """Each model's folder, the run that made it (tagged with the folder's hash), its evaluation and training summary
    as the stages before publish leave them; {model: its training run's id}."""
    ids, evaluation = {}, root / "metrics/eval.json"
    evaluated = json.loads(evaluation.read_text())["models"] if evaluation.exists() else {}
    for name, bpb in results.items():
        folder = root / "models" / name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "model.pt").write_text(f"{name} {bpb}")
        with tracking.runs.open_stage_run("ngram" if name == "ngram" else f"train@{name}", "lmpipe", {}, "h",
                                          params_file=params) as run:
            tracking.mark_output(folder)
            ids[name] = run.info.run_id
        evaluated[name] = {"test": {"bpb": bpb, "word_ppl": 2 ** (bpb * 5.6), "ppl": 100 * bpb}, "valid": {"bpb": bpb}}
        if name == "ngram":
            evaluated[name]["n_params"] = 3_210_000
        else:
            (root / "metrics/train").mkdir(parents=True, exist_ok=True)
            (root / f"metrics/train/{name}.json").write_text(json.dumps(
                {"n_params": 1_843_200, "train_flops": 3.0006e13, "tokens_seen": 9_100_000, "epochs": 3.2,
                 "identity": "made-so"}))
    evaluation.write_text(json.dumps({"models": evaluated}))
    return ids


def publish(root: Path) -> None:
    """The publish stage as `dvc repro` runs it (its flow's body), after the report it logs."""
    from flows.publish import publish as stage

    shutil.copy(ROOT / "dvc.yaml", root / "dvc.yaml")  # the stage's outputs, whose hash marks its run
    (root / "reports/figures").mkdir(parents=True, exist_ok=True)
    for name in ("study.md", "study.html"):
        (root / "reports" / name).write_text("# lmpipe study\n")
    stage.fn()


@pytest.fixture()
def store(mlflow_store, params_file, tmp_path, monkeypatch):
    """The test's own MLflow store, run from tmp_path with the committed params.yaml (the views read its models)."""
    monkeypatch.chdir(tmp_path)
    return params_file


def test_the_leaderboard_view_holds_the_rows_of_the_models_the_workspace_holds(store, tmp_path):
    assert views.published_runs("lmpipe") == []  # nothing published yet
    trained_models(tmp_path, store, {"gru": 2.0, "ngram": 2.1})
    publish(tmp_path)
    first = views.published_runs("lmpipe")
    trained_models(tmp_path, store, {"gru": 1.9})  # a retrain replaces the gru, and the study is published again
    publish(tmp_path)
    runs = views.published_runs("lmpipe")
    client = MlflowClient()
    assert len(runs) == 2 and not set(runs) & set(first)
    assert [client.get_run(r).data.tags[views.MODEL] for r in runs] == ["gru", "ngram"]  # best first
    every = views.every_published("lmpipe")  # the earlier gru once, the n-gram once (published twice, unchanged)
    assert len(every) == 3 and set(runs) < set(every)

    key = views.share("lmpipe", views.leaderboard_state(runs, "KN-5"))
    assert views.share("lmpipe", views.leaderboard_state(runs, "KN-5")) == key  # the same view: the same key, one tag
    experiment = client.get_experiment_by_name("lmpipe")
    state = json.loads(experiment.tags[views.SHARED_VIEW + key])
    assert state["searchFilter"] == f"attributes.run_id IN ('{runs[0]}', '{runs[1]}')"
    assert (state["orderByKey"], state["orderByAsc"]) == ("metrics.`test_bpb_mean`", True)
    assert state["selectedColumns"] == ["tags.`test bpb`", "tags.`vs KN-5`", "tags.`word ppl`", "tags.`size`",
                                        "tags.`training FLOPs`"]
    found = client.search_runs([experiment.experiment_id], state["searchFilter"])  # MLflow's own reading
    assert sorted(r.info.run_id for r in found) == sorted(runs)
    chart = views.SHARED_VIEW + views.share("lmpipe", views.chart_state(runs, "KN-5"))
    chart = json.loads(client.get_experiment_by_name("lmpipe").tags[chart])
    assert chart["searchFilter"] == state["searchFilter"] and chart["orderByKey"] == "metrics.`test_bpb_mean`"
    assert [c["metricKey"] for c in chart["compareRunCharts"]] == ["test_bpb_mean"]  # one chart: test bpb
    assert views.chart_url("http://ui", "lmpipe", key).endswith(f"viewStateShareKey={key}&compareRunsMode=CHART")
    url = views.view_url("http://ui", "lmpipe", key)
    assert url == f"http://ui/#/experiments/{experiment.experiment_id}/runs?workflowType=machine_learning" \
                  f"&viewStateShareKey={key}"
    trainers = views.made_by(runs)  # the compare view: the runs that trained them, in the rows' order
    assert [client.get_run(r).info.run_name for r in trainers] == ["train@gru", "ngram"]


@pytest.mark.browser
@browser
def test_the_printed_link_shows_every_model_s_test_bpb_best_first_without_a_click(store, tmp_path):
    trained_models(tmp_path, store, RESULTS)
    publish(tmp_path)
    assert_best_first(leaderboard_page(tmp_path), RESULTS)
    chart = leaderboard_page(tmp_path, "test bpb as a chart", grid=False)  # the chart view: test bpb, one bar a model
    assert ">Test bits per byte (lower is better)<" in chart, chart[-2000:]


def test_publish_labels_a_row_per_model_and_describes_the_version_it_registered(store, tmp_path):
    """The publish stage writes what the views and the registry page show: a row per model under its own run with
    the labels (test bpb with its seed sd, the gap to KN-5, size, FLOPs) and the ranked mark; the version of the
    model's files gets the same numbers, the commit and the settings' digest as description and tags; no other
    version does, and no training run is written."""
    ids = trained_models(tmp_path, store, {"gru": 1.9589, "ngram": 2.0485})
    evaluation = {"gru": {"test": {"bpb": 1.9589, "word_ppl": 5200.0, "ppl": 300.0}, "valid": {"bpb": 2.01}},
                  "ngram": {"test": {"bpb": 2.0485, "word_ppl": 7893.0, "ppl": 400.0}, "valid": {"bpb": 2.2},
                            "n_params": 3_210_000}}  # as seeds/seeds.csv has the study's own run
    (tmp_path / "metrics/eval.json").write_text(json.dumps({"models": evaluation}))
    (tmp_path / "seeds").mkdir()
    (tmp_path / "seeds/seeds.csv").write_text(SEEDS)
    client = MlflowClient()
    client.create_registered_model("lmpipe-gru")
    version = client.create_model_version("lmpipe-gru", f"runs:/{ids['gru']}/model",  # as score@gru registers it
                                          tags={tracking.OUTPUT: tracking.output_hash(tmp_path / "models/gru")})
    other = client.create_model_version("lmpipe-gru", "runs:/x/model", tags={tracking.OUTPUT: "another model's"})
    trained_before = {n: client.get_run(i).data for n, i in ids.items()}
    publish(tmp_path)

    rows = {client.get_run(r).data.tags[views.MODEL]: client.get_run(r).data for r in views.published_runs("lmpipe")}
    gru, ngram = rows["gru"].tags, rows["ngram"].tags
    # every number the mean over the three seeds, as the report's tables give it
    assert gru["test bpb"] == "1.958 ± 0.003" and gru["vs KN-5"] == "-0.091 bpb"
    assert (gru["word ppl"], gru["size"], gru["training FLOPs"]) == ("5,187", "1.84M", "3.00e+13")
    assert rows["gru"].metrics[views.SORT_METRIC] == pytest.approx((1.9589 + 1.96 + 1.954) / 3)
    assert rows["gru"].metrics["test_bpb"] == 1.9589  # the study's own run, as score gave it
    assert (ngram["test bpb"], ngram["vs KN-5"], ngram["size"]) == ("2.049", "baseline", "3.2M n-grams")
    assert gru["lmpipe.role"] == ngram["lmpipe.role"] == views.PUBLISHED and gru[views.MADE_BY] == ids["gru"]
    assert gru[tracking.NOTE].startswith("**gru**: test 1.958 ± 0.003 (3 seeds) bpb")
    for name, before in trained_before.items():  # the training runs: as training left them
        after = client.get_run(ids[name]).data
        assert (after.tags, after.metrics) == (before.tags, before.metrics), name
    summary = json.loads(next((tmp_path / "metrics/models").glob("*-gru.json")).read_text())
    assert summary == {"bpb": 1.9576, "sd": 0.0032, "vs_kn5": -0.0909, "tflop": 30.0}  # dvc metrics show's row
    described = client.get_model_version("lmpipe-gru", version.version)
    assert described.description.startswith("**gru**: test 1.958 ± 0.003 (3 seeds) bpb, word perplexity 5,187; "
                                            "trained on 9.10M tokens")
    assert "Against KN-5: -0.091 bpb, word perplexity 5,187 against 7,893. Trained at commit" in described.description
    assert described.tags["test_bpb"] == "1.9576" and described.tags["test_bpb_sd"] == "0.0032"
    assert (described.tags["seeds"], described.tags["vs_KN-5_bpb"], described.tags["train_flops"]) == \
           ("3", "-0.091", "3.001e+13")
    assert described.tags["params_sha256"] == tracking.runs.study_key(store).params_digest
    assert "unrecorded" not in described.description and "()" not in described.description  # no machine recorded
    assert "Against its seed's committed row: bit for bit." in described.description
    assert not client.get_model_version("lmpipe-gru", other.version).description  # another model's files

    # the study re-made on another machine, within noise of the committed seed row: the spread stays, and the card
    # and the row's description name both machines and the distance in seed sds
    seeds_elsewhere = SEEDS.replace(",,made-so,", ",bf16,made-so,Zen 5 (AVX512-BF16)")
    (tmp_path / "seeds/seeds.csv").write_text(seeds_elsewhere)
    trained = json.loads((tmp_path / "metrics/train/gru.json").read_text())
    (tmp_path / "metrics/train/gru.json").write_text(json.dumps({**trained, "machine": "Zen 3 (AVX2)",
                                                                 "precision": "fp32"}))
    evaluation["gru"]["test"]["bpb"] = 1.9589 + 0.0035  # 1.1 of its seed sd (0.0032) from the committed row
    (tmp_path / "metrics/eval.json").write_text(json.dumps({"models": evaluation}))
    publish(tmp_path)
    described = client.get_model_version("lmpipe-gru", version.version)
    assert "Trained on Zen 3 (AVX2) (fp32), its seeds' rows on Zen 5 (AVX512-BF16) (bf16); against its seed's " \
           "committed row: within noise, 1.1 sd." in described.description, described.description
    assert described.tags["seeds"] == "3" and described.tags["trained_on"] == "Zen 3 (AVX2) (fp32)"
    rows = {client.get_run(r).data.tags[views.MODEL]: client.get_run(r).data for r in views.published_runs("lmpipe")}
    assert "its seeds' rows on Zen 5 (AVX512-BF16) (bf16)" in rows["gru"].tags[tracking.NOTE]
    assert rows["gru"].tags["test bpb"].endswith("± 0.003")  # the spread kept on the other machine
    (tmp_path / "seeds/seeds.csv").write_text(SEEDS)
    evaluation["gru"]["test"]["bpb"] = 1.9589
    (tmp_path / "metrics/eval.json").write_text(json.dumps({"models": evaluation}))

    # the model trained again with other code: its seed rows are of an earlier training, and the card says so
    (tmp_path / "metrics/train/gru.json").write_text(json.dumps(
        {"n_params": 1_843_200, "train_flops": 3.0006e13, "tokens_seen": 9_100_000, "epochs": 3.2,
         "identity": "made-otherwise"}))
    publish(tmp_path)
    described = client.get_model_version("lmpipe-gru", version.version)
    assert "7,893. No seed spread: seeds/seeds.csv's rows of it are made by other code, params or data than this " \
           "study's (run `lmpipe seeds` again). Trained at commit" in described.description, described.description
    assert (described.tags["test_bpb_sd"], described.tags["seeds"]) == ("unknown", "1")
    rows = {client.get_run(r).data.tags[views.MODEL]: client.get_run(r).data for r in views.published_runs("lmpipe")}
    assert rows["gru"].tags["test bpb"] == "1.959"  # no spread shown


def test_a_count_of_n_grams_is_two_or_three_digits_and_a_unit():
    """The n-gram's size in its 100-px cell: "0.47M n-grams" was cut (81 px of 76), "470k n-grams" is whole (73)."""
    assert [views.short_count(n) for n in (470_123, 999_600, 1_753_000, 12_300_000)] == ["470k", "1M", "1.8M", "12M"]
