"""The MLflow views `lmpipe ui` prints: the runs that made the models the workspace holds, best test bpb first."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from lmpipe import mlflow_views as views
from lmpipe import tracking
from lmpipe.seeds import Spread
from tests.helpers import assert_best_first, browser, leaderboard_page

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
            test = {"bpb": bpb, "word_ppl": 2 ** (bpb * 5.6), "ppl": 100 * bpb}
            tracking.log_metrics({f"test_{k}": v for k, v in test.items()} | {views.SORT_METRIC: bpb})
            tracking.mark_output(folder)
            neural = name != "ngram"  # the widest labels a study gives: a seed sd, the n-gram's count of n-grams
            spread = Spread(3 if neural else 1, bpb, 0.0023 if neural else 0.0, test["word_ppl"], None)
            shown = views.labels(name, spread, ("KN-5", Spread(1, 2.0485, 0.0, 7893.0, 0.0)),
                                 1.84e6 if neural else 1.753e6, 3.0006e13 if neural else None)
            tracking.set_tags(run.info.run_id, {**shown, views.RANKED: "yes"})  # what the report stage labels
            ids[name] = run.info.run_id
    return ids


@pytest.fixture()
def store(mlflow_store, params_file, tmp_path, monkeypatch):
    """The test's own MLflow store, run from tmp_path with the committed params.yaml (the views read its models)."""
    monkeypatch.chdir(tmp_path)
    return params_file


def test_the_leaderboard_view_holds_the_runs_that_made_the_models_the_workspace_holds(store, tmp_path, monkeypatch):
    assert views.current_runs("lmpipe", ["models/gru", "models/ngram"]) == []  # nothing trained yet
    ids = make_runs(tmp_path, store, {"gru": 2.0, "ngram": 2.1})
    make_runs(tmp_path, store, {"gru": 1.9})  # a retrain replaces the gru: its first run made no file here now
    monkeypatch.setenv("DVC_EXP_NAME", "lanky-bass")  # nor does an experiment's run that left the workspace as it was
    with tracking.runs.open_stage_run("train@gru", "lmpipe", {}, "h", params_file=store):
        pass
    runs = views.current_runs("lmpipe", ["models/gru", "models/ngram", "models/gone"])
    assert ids["gru"] not in runs and ids["ngram"] in runs and len(runs) == 2

    key = views.share("lmpipe", views.leaderboard_state(runs, "KN-5"))
    assert views.share("lmpipe", views.leaderboard_state(runs, "KN-5")) == key  # the same view: the same key, one tag
    experiment = MlflowClient().get_experiment_by_name("lmpipe")
    state = json.loads(experiment.tags[views.SHARED_VIEW + key])
    assert state["searchFilter"] == f"attributes.run_id IN ('{runs[0]}', '{runs[1]}')"
    assert (state["orderByKey"], state["orderByAsc"]) == ("metrics.`test_bpb_mean`", True)
    assert state["selectedColumns"] == ["tags.`test bpb`", "tags.`vs KN-5`", "tags.`word ppl`", "tags.`size`",
                                        "tags.`training FLOPs`"]
    found = MlflowClient().search_runs([experiment.experiment_id], state["searchFilter"])  # MLflow's own reading
    assert sorted(r.info.run_id for r in found) == runs
    chart = views.SHARED_VIEW + views.share("lmpipe", views.chart_state(runs, "KN-5"))
    chart = json.loads(MlflowClient().get_experiment_by_name("lmpipe").tags[chart])
    assert chart["searchFilter"] == state["searchFilter"] and chart["orderByKey"] == "metrics.`test_bpb_mean`"
    assert [c["metricKey"] for c in chart["compareRunCharts"]] == ["test_bpb_mean"]  # one chart: test bpb
    assert views.chart_url("http://ui", "lmpipe", key).endswith(f"viewStateShareKey={key}&compareRunsMode=CHART")
    url = views.view_url("http://ui", "lmpipe", key)
    assert url == f"http://ui/#/experiments/{experiment.experiment_id}/runs?workflowType=machine_learning" \
                  f"&viewStateShareKey={key}"


@pytest.mark.browser
@browser
def test_the_printed_link_shows_every_model_s_test_bpb_best_first_without_a_click(store, tmp_path):
    make_runs(tmp_path, store, RESULTS)
    assert_best_first(leaderboard_page(tmp_path), RESULTS)
    chart = leaderboard_page(tmp_path, "test bpb as a chart", grid=False)  # the chart view: test bpb, one bar a model
    assert ">Test bits per byte (lower is better)<" in chart, chart[-2000:]


def test_the_report_labels_each_model_run_and_describes_the_version_it_registered(store, tmp_path):
    """The report stage writes what the views and the registry page show: each model's run gets the labels (test bpb
    with its seed sd, the gap to KN-5, size, FLOPs) and the ranked mark; the version of its files gets
    the same numbers, the commit and the settings' digest as description and tags; no other version does."""
    from flows.report import label_each_model_run
    from lmpipe.config import load_params

    ids = {}
    for name in ("gru", "ngram"):
        folder = tmp_path / "models" / name
        folder.mkdir(parents=True)
        (folder / "model.pt").write_text(name)
        with tracking.runs.open_stage_run("ngram" if name == "ngram" else f"train@{name}", "lmpipe", {}, "h",
                                          params_file=store) as run:
            tracking.mark_output(folder)
            ids[name] = run.info.run_id
    (tmp_path / "metrics/train").mkdir(parents=True)
    (tmp_path / "metrics/train/gru.json").write_text(json.dumps(
        {"n_params": 1_843_200, "train_flops": 3.0006e13, "tokens_seen": 9_100_000, "epochs": 3.2,
         "identity": "made-so"}))
    (tmp_path / "seeds").mkdir()
    (tmp_path / "seeds/seeds.csv").write_text(  # the study's own run and two more seeds, of its identity
        "model,seed,valid_bpb,test_bpb,test_word_ppl,precision,identity,machine\n"
        "gru,1234,2.01,1.9589,5200.0,,made-so,\ngru,1,2.02,1.9600,5210.0,,made-so,\n"
        "gru,2,2.00,1.9540,5150.0,,made-so,\n")
    client = MlflowClient()
    client.create_registered_model("lmpipe-gru")
    version = client.create_model_version("lmpipe-gru", f"runs:/{ids['gru']}/model",  # as score@gru registers it
                                          tags={tracking.OUTPUT: tracking.output_hash(tmp_path / "models/gru")})
    other = client.create_model_version("lmpipe-gru", "runs:/x/model", tags={tracking.OUTPUT: "another model's"})
    models = {"gru": {"test": {"bpb": 1.9589, "word_ppl": 5200.0, "ppl": 300.0}, "valid": {"bpb": 2.01}},
              "ngram": {"test": {"bpb": 2.0485, "word_ppl": 7893.0, "ppl": 400.0}, "valid": {"bpb": 2.2},
                        "n_params": 3_210_000}}
    label_each_model_run(load_params(store), models)

    gru, ngram = (client.get_run(ids[n]).data.tags for n in ("gru", "ngram"))
    # every number the mean over the three seeds, as the report's tables give it
    assert gru["test bpb"] == "1.958 ± 0.003" and gru["vs KN-5"] == "-0.091 bpb"
    assert (gru["word ppl"], gru["size"], gru["training FLOPs"]) == ("5,187", "1.84M", "3.00e+13")
    assert client.get_run(ids["gru"]).data.metrics[views.SORT_METRIC] == pytest.approx((1.9589 + 1.96 + 1.954) / 3)
    assert (ngram["test bpb"], ngram["vs KN-5"], ngram["size"]) == ("2.049", "baseline", "3.2M n-grams")
    assert gru[views.RANKED] == ngram[views.RANKED] == "yes"
    described = client.get_model_version("lmpipe-gru", version.version)
    assert described.description.startswith("**gru**: test 1.958 ± 0.003 (3 seeds) bpb, word perplexity 5,187; "
                                            "trained on 9.10M tokens")
    assert "Against KN-5: -0.091 bpb, word perplexity 5,187 against 7,893. Trained at commit" in described.description
    assert described.tags["test_bpb"] == "1.9576" and described.tags["test_bpb_sd"] == "0.0032"
    assert (described.tags["seeds"], described.tags["vs_KN-5_bpb"], described.tags["train_flops"]) == \
           ("3", "-0.091", "3.001e+13")
    assert described.tags["params_sha256"] == tracking.runs.study_key(store).params_digest
    assert not client.get_model_version("lmpipe-gru", other.version).description  # another model's files
    found = client.search_runs([client.get_experiment_by_name("lmpipe").experiment_id],
                               views.runs_state("KN-5")["searchFilter"])  # the "every model so far" view's rows
    assert sorted(r.info.run_id for r in found) == sorted(ids.values())

    # the model trained again with other code: its seed rows are of an earlier training, and the card says so
    (tmp_path / "metrics/train/gru.json").write_text(json.dumps(
        {"n_params": 1_843_200, "train_flops": 3.0006e13, "tokens_seen": 9_100_000, "epochs": 3.2,
         "identity": "made-otherwise"}))
    label_each_model_run(load_params(store), models)
    described = client.get_model_version("lmpipe-gru", version.version)
    assert "7,893. No seed spread: seeds/seeds.csv's rows of it are made by other code, params or data than this " \
           "study's (run `lmpipe seeds` again). Trained at commit" in described.description, described.description
    assert (described.tags["test_bpb_sd"], described.tags["seeds"]) == ("unknown", "1")
    assert client.get_run(ids["gru"]).data.tags["test bpb"] == "1.959"  # no spread shown


def test_a_count_of_n_grams_is_two_or_three_digits_and_a_unit():
    """The n-gram's size in its 100-px cell: "0.47M n-grams" was cut (81 px of 76), "470k n-grams" is whole (73)."""
    assert [views.short_count(n) for n in (470_123, 999_600, 1_753_000, 12_300_000)] == ["470k", "1M", "1.8M", "12M"]
