"""The real `dvc repro` in a temporary git copy of the project, on a few real articles."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import requests
import yaml
from mlflow.tracking import MlflowClient

from lmpipe.io import sha256_tree
from lmpipe.ngram import NGramLM

from tests.conftest import ROOT
from tests.helpers import (ADAMW, QuietHandler, as_in_a_terminal, assert_best_first, browser, entry, has_row,
                           http_server, leaderboard_page, table_rows)

pytestmark = pytest.mark.e2e
# `make test` runs on pytest-xdist's workers (tests/conftest.py): these tests, about half of this module's time, form
# a group of their own, which a second worker runs beside a second copy of the study.
SECOND_STUDY = ("test_a_team_shares_one_mlflow_and_prefect_on_postgresql_and_one_dvc_remote",
                "test_a_failure_after_training_keeps_the_training_and_the_rerun_does_not_train_again",
                "test_study_flow_trains_the_models_in_parallel_on_a_local_cluster",
                "test_scaling_pipeline_trains_its_grid_to_budget_fits_and_reports",
                "test_torchrun_runs_a_train_stage_on_two_processes_and_dvc_commit_records_it",
                "test_seeds_retrain_every_model_and_the_report_gives_mean_sd_and_verdicts",
                "test_a_store_without_the_runs_of_skipped_stages_gets_them_and_nothing_else_changes")
MODELS = ("nplm", "rnn", "lstm", "gru", "transformer")
STAGES = ("download", "prepare", "validate", "tokenize", "ngram") + tuple(f"train@{m}" for m in MODELS) + (
    "score_ngram",) + tuple(f"score@{m}" for m in MODELS) + ("evaluate", "combine", "word2vec", "audit", "report")
QUICK = {"epochs": 1, "max_steps_per_epoch": 3, "batch_size": 4, "seq_len": 16}


TINY = {
    "corpus": {"max_articles": 12},
    "split": {"seed": 57, "valid": 0.02, "test": 0.02},  # one short article each (1,872 and 1,708 words): scoring is quick
    "validate": {"min_words": 200, "max_oov_rate": 0.6},
    "tokenizer": {"vocab_size": 600},
    "evaluate": {"prompts": ["The history of"], "max_new_tokens": 8, "beam_size": 2},
    "study": {"budget": None, "branches": []},  # each tiny model by its own few steps
    "models": {
        "nplm": entry("nplm", {"context": 3, "emb": 16, "hidden": 32}, **QUICK),
        "rnn": entry("rnn", {"cell": "rnn_tanh", "emb": 16, "layers": 1}, **QUICK),
        "lstm": entry("rnn", {"cell": "lstm", "emb": 16, "hidden": 32, "layers": 2, "weight_drop": 0.2},
                      variable_bptt=True, **QUICK),
        "gru": entry("rnn", {"cell": "gru", "emb": 16, "layers": 1}, **QUICK),
        "transformer": entry("transformer", {"dim": 16, "layers": 1, "heads": 2, "block_size": 16}, **QUICK),
    },
    "scaling": {  # 2 sizes of 2 families at 4 budgets: enough for every fit (a law needs 5 points), ~2 minutes
        "models": {"transformer": [{"dim": 8}, {"dim": 16}], "lstm": [{"emb": 8, "hidden": 8}, {"emb": 16, "hidden": 16}]},
        "budgets": [2e8, 4e8, 8e8, 1.6e9],
        "overrides": {"max_steps_per_epoch": None},
        "evals_per_epoch": 1,
        "precision": "fp32",  # as the committed grid, on any CPU
        "seeds": {"extra": [1], "budgets": [2e8]},  # every size again with seed 1 at the smallest budget
        "fit": {"bootstrap": 5, "seed": 0, "huber_delta": 0.001},
    },
}


def run(args, cwd, env, check=True, timeout=600):
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise AssertionError(f"{args} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done


def stop(process: subprocess.Popen) -> None:
    """End a background server and its children: politely, then for sure."""
    import signal

    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


def override(path: Path, changes: dict) -> None:
    params = yaml.safe_load(path.read_text())
    for section, values in changes.items():
        if section in ("models", "scaling"):
            params[section] = values
        else:
            params[section].update(values)
    path.write_text(yaml.safe_dump(params, sort_keys=False))


@pytest.fixture(scope="module")
def project(tmp_path_factory, prefect_api):
    """A git copy of the tracked project with tiny params, after one `dvc repro`."""
    copy = tmp_path_factory.mktemp("project")
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True)
    for name in filter(None, tracked.stdout.split("\0")):
        if (ROOT / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, copy / name)
    for name in ("dvc.lock", "scaling/dvc.lock"):  # a fresh study: nothing recorded yet
        (copy / name).unlink(missing_ok=True)
    override(copy / "params.yaml", TINY)
    env = {**os.environ, "PREFECT_API_URL": prefect_api, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL": "0.2"}  # a tiny training can end within 1 s, and MLflow logs
    # no sample for a run that ends before its first interval (on a Zen 5, CI: no system/* metric at 1 s)
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("LMPIPE_PARENT_RUN_ID", None)
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    run(["git", "init", "-q"], copy, env)
    run(git + ["add", "-A"], copy, env)
    run(git + ["commit", "-qm", "copy"], copy, env)
    first = run(["dvc", "repro"], copy, env, timeout=1800)  # every stage: ~10 min on a 2-core CPU without native bf16
    return copy, env, first


@pytest.fixture
def scratch(project, tmp_path):
    """A copy of the studied project (git, DVC cache, MLflow store and all) that a test may change freely: no test
    depends on another's edits."""
    copy, env, _ = project
    target = tmp_path / "project"
    shutil.copytree(copy, target, symlinks=True, ignore=shutil.ignore_patterns("mlartifacts", "mlflow.db*"))  # its own store
    return target, env


def test_repro_runs_every_stage_and_writes_contract_outputs(project):
    copy, env, first = project
    for stage in STAGES:
        assert f"Running stage '{stage}'" in first.stdout
    corpus = json.loads((copy / "metrics/corpus.json").read_text())
    assert sum(s["articles"] for s in corpus["splits"].values()) == 12
    for split in ("train", "valid", "test"):
        text = (copy / f"data/clean/{split}.txt").read_text()
        assert corpus["splits"][split]["words"] == len(text.split()) > 200
    assert json.loads((copy / "metrics/validation.json").read_text())["success"] is True
    assert (copy / "reports/validation/index.html").exists()
    tokens = json.loads((copy / "metrics/tokenize.json").read_text())
    assert tokens["vocab_size"] == 600
    for split in ("train", "valid", "test"):
        ids = np.load(copy / f"data/tokens/{split}.npy")
        assert len(ids) == tokens["tokens"][split] and ids.dtype == np.uint16
    manifest = json.loads((copy / "data/raw/manifest.json").read_text())
    assert manifest["files"]["enwiki-sample.xml.bz2"]["sha256"] == (
        "a53f4648dec40467ebdcbc7a1307eddb51fe6e28e9309f6ebde81ba0d04bea2d")
    ngram = json.loads((copy / "metrics/ngram.json").read_text())
    assert ngram["order"] == 5 and ngram["normalised"] is True
    assert 1 < ngram["test"]["ppl"] < 600 and ngram["test"]["bpb"] > 0
    baseline = NGramLM.load(copy / "models/ngram")  # memory-mapped .npy tables
    assert baseline.order == 5 and isinstance(baseline.tables[-1].keys, np.memmap)
    for model in MODELS:
        trained = json.loads((copy / f"metrics/train/{model}.json").read_text())
        assert trained["model"] == model and trained["epochs"] == 1 and trained["device"] == "cpu"
        assert trained["valid_ppl"] > 1 and trained["n_params"] > 0
        assert (copy / f"models/{model}/model.pt").exists()
        assert (copy / f"plots/train/{model}.csv").read_text().startswith("epoch,step,tokens,flops,train_loss,")
    evaluation = json.loads((copy / "metrics/eval.json").read_text())
    assert set(evaluation["models"]) == {"ngram", *MODELS}
    assert evaluation["models"]["ngram"]["test"]["ppl"] == pytest.approx(ngram["test"]["ppl"])  # one accounting
    assert set(evaluation["decoding"]) == {"greedy", "beam", "top-k", "top-p", "typical"}
    combined = json.loads((copy / "metrics/combine.json").read_text())["models"]
    assert {f"{m}+ngram" for m in MODELS} | {"+".join(sorted(("ngram", *MODELS)))} <= set(combined)
    assert len(combined) == len(MODELS) + 3  # each with KN, the best neural pair, all of them, all with the cache
    cached = combined["+".join(sorted(("ngram", *MODELS))) + "+cache"]
    assert cached["cache_window"] in (50, 100, 200, 500, 1000, 2000) and cached["weights"]["cache"] > 0
    for name, row in combined.items():
        assert abs(sum(row["weights"].values()) - 1) < 1e-9 and set(row["weights"]) == set(name.split("+"))
        best_part = min(evaluation["models"][m]["valid"]["bpb"] for m in row["weights"] if m != "cache")
        assert row["valid"]["bpb"] <= best_part + 1e-4  # fitted on valid: never worse there than its best part
    assert "## Combined models" in (copy / "reports/study.md").read_text()
    samples = (copy / "reports/samples.md").read_text()
    assert samples.count("- The history of") == len(MODELS + ("ngram",)) * 5
    study = (copy / "reports/study.md").read_text()
    assert "## Perplexity" in study and has_row(study, "ngram (baseline)")
    assert "data:image/png;base64," in (copy / "reports/study.html").read_text()
    weat = json.loads((copy / "metrics/weat.json").read_text())
    assert set(weat["models"]) == {*MODELS, "word2vec"}
    assert all(set(r) == {f"weat{i}" for i in range(1, 11)} for r in weat["models"].values())
    assert all(t["status"] in ("ok", "insufficient_coverage") for r in weat["models"].values() for t in r.values())
    assert (copy / "plots/weat/heatmap.png").stat().st_size > 1000
    shown = run(["dvc", "metrics", "show", "--md"], copy, env).stdout.splitlines()
    assert sorted(line.split()[1] for line in shown if line.startswith("| metrics/")) == [
        f"metrics/models/{m}.json" for m in sorted(("ngram", *MODELS))]  # a row per model, nothing else
    assert max(map(len, shown)) < 120, "\n".join(shown)
    assert (copy / "data/embeddings/word2vec.txt").exists() and "## Bias audit (WEAT)" in study
    lock = yaml.safe_load((copy / "dvc.lock").read_text())
    assert set(lock["stages"]) == set(STAGES)


def test_dvc_plots_show_draws_every_plot_offline(project):
    """`dvc plots show` fills the report's page (.dvc/config): no CDN, and every Vega-Lite spec in it compiles and
    renders with the inlined Vega-Lite version (vl-convert renders it here as a browser would, offline)."""
    import re

    import vl_convert

    copy, env, _ = project
    run(["dvc", "plots", "show", "--out", "dvc_plots"], copy, env)
    page = (copy / "dvc_plots/index.html").read_text()
    assert "cdn.jsdelivr" not in page and not re.search(r"<script[^>]+src=", page) and "window.vegaEmbed=" in page
    specs = [json.loads(s) for s in re.findall(r"var spec = (\{.*?\});\s*vegaEmbed", page, re.S)]
    assert len(specs) == len(MODELS) + 2  # a learning curve per model, all of them against FLOPs, the perplexity bars
    together = [s for s in specs if s.get("encoding", {}).get("color", {}).get("field") == "model"]
    assert len(together) == 1 and together[0]["encoding"]["x"]["field"] == "flops"
    assert {row["model"] for row in together[0]["data"]["values"]} == set(MODELS)  # every model on one axis
    for spec in specs:
        assert "<svg" in vl_convert.vegalite_to_svg(spec, vl_version="5.21")
    assert "heatmap.png" in page  # the WEAT heatmap, an image DVC embeds


def test_second_repro_does_nothing(project):
    copy, env, _ = project
    again = run(["dvc", "repro"], copy, env)
    assert "Running stage" not in again.stdout
    assert "Data and pipelines are up to date." in again.stdout


def test_study_flow_with_nothing_to_do_adds_no_empty_study_run(project):
    copy, env, _ = project
    client = MlflowClient(f"sqlite:///{copy / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("lmpipe").experiment_id

    def studies():
        return len(client.search_runs([experiment], "tags.`lmpipe.role` = 'study'"))

    before = studies()
    done = run([sys.executable, "-m", "flows.study"], copy, env)
    assert "Data and pipelines are up to date" in done.stdout and studies() == before


@pytest.mark.browser
@browser
def test_after_the_study_its_mlflow_views_and_registry_say_by_how_much(project, monkeypatch):
    """The study's own MLflow store, as `lmpipe ui` shows it in a browser: each of its six models once, best test
    bpb first, with the labels the report stage wrote (test bpb, the gap to KN-5, size, FLOPs); the "every model so
    far" view holds each model once (not its scoring run too); each champion's version states its numbers."""
    from lmpipe import mlflow_views as views

    copy, env, _ = project
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    results = {p.stem: json.loads(p.read_text())["test"]["bpb"] for p in sorted((copy / "metrics/eval").glob("*.json"))}
    assert sorted(results) == sorted([*MODELS, "ngram"])
    assert_best_first(leaderboard_page(copy), results)
    client = MlflowClient(f"sqlite:///{copy / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("lmpipe").experiment_id
    ranked = client.search_runs([experiment], views.runs_state("KN-5")["searchFilter"])
    assert sorted(r.info.run_name for r in ranked) == sorted(["ngram", *(f"train@{m}" for m in MODELS)])
    for model in MODELS:
        version = client.get_model_version_by_alias(f"lmpipe-{model}", "champion")
        assert f"test {results[model]:.3f} bpb" in version.description and "Against KN-5: " in version.description
        assert version.tags["test_bpb"] == f"{results[model]:.4f}" and version.tags["params_sha256"]


@pytest.mark.slow
def test_scaling_pipeline_trains_its_grid_to_budget_fits_and_reports(project):
    """`lmpipe scaling`: every size at every budget as MLflow children of one scaling run, each ending at its FLOP
    budget, committed to the frozen grid stage; the fits and the report; a second run does nothing. The study's
    report called the committed grid (made on the real corpus) stale; after the grid it compares with it."""
    import math

    copy, env, _ = project
    assert re.search(r"The scaling grid \(reports/scaling\.md: .*\): not compared, as it was trained from other "
                     r"data/tokens, scaling, (models\.\w+, )*models\.transformer than this study",
                     (copy / "reports/study.md").read_text())
    done = run(["lmpipe", "scaling"], copy, env)
    assert "Running stage 'scaling/dvc.yaml:fit'" in done.stdout
    assert json.loads(run(["dvc", "status", "--json", "scaling/dvc.yaml"], copy, env).stdout) == {}
    with open(copy / "scaling/runs.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 20 and {r["model"] for r in rows} == {"transformer", "lstm"}
    assert sorted(r["name"] for r in rows if r["name"].endswith("-seed1")) == [
        "lstm-emb16-hidden16-C2.0e+08-seed1", "lstm-emb8-hidden8-C2.0e+08-seed1",
        "transformer-dim16-C2.0e+08-seed1", "transformer-dim8-C2.0e+08-seed1"]
    for r in rows:  # each run stops at its budget (in steps: under the LSTM's variable BPTT a step's tokens vary)
        assert abs(float(r["flops"]) - float(r["budget"])) <= 0.05 * float(r["budget"])
        assert float(r["n_params"]) > float(r["n_params_non_embedding"]) > 0
        assert not {"wall_seconds", "train_seconds", "flops_per_sec"} & set(r)  # timings: MLflow, not the tracked csv
        assert float(r["valid_loss"]) == pytest.approx(math.log(float(r["valid_ppl"])))
    summary = json.loads((copy / "metrics/scaling.json").read_text())
    for family in ("transformer", "lstm"):
        fit = summary["families"][family]
        assert fit["runs"] == 8 and len(fit["isoflop"]) == 4 and len(fit["holdout"]["runs"]) == 2
        assert fit["holdout"]["mean_abs_relative_error"] is not None
        assert set(fit["law"]) == {"E", "A", "alpha", "B", "beta"} and set(fit["predictions"]) == {"10x", "100x"}
    report = (copy / "reports/scaling.md").read_text()
    for heading in ("## Best run at each budget", "## IsoFLOP profiles", "## The fitted law", "## Does the law predict"):
        assert heading in report
    assert report.split("\n")[2].startswith("20 runs, 16 points: 2 sizes of each of ")  # a seeded point: its mean
    seeded = summary["seed_spread"]
    assert [(s["budget"], s["seeds"], s["points"]) for s in seeded] == [(2e8, 2, 4)] and seeded[0]["sd"] > 0
    assert "## Seeds" in report and ["2.0e+08", "2", "4", f"{seeded[0]['sd']:.4f}",
                                     f"{seeded[0]['sd'] / math.sqrt(2):.4f}"] in table_rows(report)
    assert (copy / "reports/scaling.html").read_text().count("data:image/png;base64,") == 3
    client = MlflowClient(f"sqlite:///{copy / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("lmpipe")
    parents = client.search_runs([experiment.experiment_id], "tags.`lmpipe.role` = 'scaling'")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    children = client.search_runs([experiment.experiment_id],
                                  f"tags.`mlflow.parentRunId` = '{parents[0].info.run_id}'")
    assert sorted(c.info.run_name for c in children) == sorted(r["name"] for r in rows)
    assert "transformer.alpha" in parents[0].data.metrics  # the fits, beside the runs they come from
    again = run(["dvc", "repro", "scaling/dvc.yaml"], copy, env)
    assert "Running stage" not in again.stdout
    study = run(["dvc", "repro"], copy, env)  # the report alone: the grid is current now, but shares no budget
    assert ran_stages(study.stdout) == {"report"}
    assert re.search(r"The scaling grid \(reports/scaling\.md: lstm, transformer at 4 budgets from 2\.00e\+08 to "
                     r"1\.60e\+09 FLOPs, .*\): not compared, as the study has no annealed result at its budgets",
                     (copy / "reports/study.md").read_text())


@pytest.mark.slow
def test_seeds_retrain_every_model_and_the_report_gives_mean_sd_and_verdicts(scratch):
    """`lmpipe seeds`: every model at each seed of seeds.extra beside the study's own run, in seeds/seeds.csv and
    committed to its frozen DVC stage; the study's repro then re-runs the report alone, which gives mean ± sd; a
    second call trains nothing."""
    copy, env = scratch
    done = run(["lmpipe", "seeds"], copy, env)
    with open(copy / "seeds/seeds.csv") as f:
        rows = list(csv.DictReader(f))
    assert sorted((r["model"], int(r["seed"])) for r in rows) == sorted((m, s) for m in MODELS for s in (1, 2, 1234))
    evaluation = json.loads((copy / "metrics/eval.json").read_text())["models"]
    for r in rows:
        if int(r["seed"]) == 1234:  # the study's own run, its numbers to the last digit
            assert float(r["test_bpb"]) == evaluation[r["model"]]["test"]["bpb"]
    gru = sorted(float(r["test_bpb"]) for r in rows if r["model"] == "gru")
    assert len(set(gru)) == 3  # the seed decides the run
    assert "gru: test bpb" in done.stdout and "over 3 seeds" in done.stdout
    assert "seeds/seeds.csv" in (copy / "seeds/dvc.lock").read_text()
    with open(copy / "seeds/weat.csv") as f:  # every seed's audit, the study's own as metrics/weat.json has it
        effects = list(csv.DictReader(f))
    audited = json.loads((copy / "metrics/weat.json").read_text())["models"]
    ran = {(m, t) for m in MODELS for t, r in audited[m].items() if r["effect_size"] is not None}
    assert {(r["model"], r["test"]) for r in effects if r["seed"] == "1234"} == ran
    assert all(float(r["effect_size"]) == audited[r["model"]][r["test"]]["effect_size"] for r in effects
               if r["seed"] == "1234")

    after = run(["dvc", "repro"], copy, env)
    assert ran_stages(after.stdout) == {"report"}
    section = (copy / "reports/study.md").read_text().split("## Seeds and verdicts")[1]
    for model in MODELS:
        assert f"- **{model}**: test " in section and "(3 seeds)" in section
    assert "Stale" not in section
    assert json.loads((copy / "metrics/models/gru.json").read_text())["seeds"] == 3

    again = run(["lmpipe", "seeds"], copy, env)
    assert again.stdout.count("(trained before, reused)") == 2 * len(MODELS)
    one = run(["lmpipe", "seeds", "--models", "gru"], copy, env)  # the other models' rows stay as they are
    assert one.stdout.count("(trained before, reused)") == 2 and "gru-seed1" in one.stdout
    with open(copy / "seeds/seeds.csv") as f:
        assert sorted(map(tuple, (r.values() for r in csv.DictReader(f)))) == sorted(map(tuple, (r.values() for r in rows)))
    params = copy / "params.yaml"
    tree = yaml.safe_load(params.read_text())
    tree["models"]["gru"]["optim"]["lr"] *= 2
    params.write_text(yaml.safe_dump(tree, sort_keys=False))
    planned = ran_stages(run(["dvc", "repro", "--dry"], copy, env).stdout)
    assert "train@gru" in planned and not any(stage.startswith("seeds") for stage in planned)  # frozen
    # (the report of a model retrained since calls its rows stale: tests/test_seeds.py)


def test_changed_params_rerun_only_what_depends_on_them(scratch):  # its own copy: it edits params.yaml
    copy, env = scratch
    params = copy / "params.yaml"
    saved = params.read_text()
    try:
        override(params, {"tokenizer": {"vocab_size": 700}})
        status = run(["dvc", "status", "--json", "dvc.yaml"], copy, env)
        # the rest follows once tokens change; the report names params.yaml's sha256, so any edit re-makes it
        assert set(json.loads(status.stdout)) == {"tokenize", "report"}
        params.write_text(saved)
        changed = yaml.safe_load(saved)
        changed["models"]["gru"]["arch"]["emb"] = 24
        params.write_text(yaml.safe_dump(changed, sort_keys=False))
        status = run(["dvc", "status", "--json", "dvc.yaml"], copy, env)
        assert set(json.loads(status.stdout)) == {"train@gru", "evaluate", "combine", "audit", "report"}  # read `models`
    finally:
        params.write_text(saved)


def test_every_stage_is_an_mlflow_run_and_a_prefect_flow_run(project, prefect_api):
    copy, _, _ = project
    client = MlflowClient(f"sqlite:///{copy / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("lmpipe")
    runs = client.search_runs([experiment.experiment_id])
    stages = {r.data.tags["lmpipe.stage"]: r for r in runs if r.data.tags.get("lmpipe.role") == "stage"}
    studies = [r for r in runs if r.data.tags.get("lmpipe.role") == "study"]
    assert set(stages) == set(STAGES) and len(studies) == 1
    study = studies[0].info  # ended by the report stage, the last: its duration spans the stages
    assert study.end_time >= max(r.info.end_time for r in stages.values() if r.data.tags["lmpipe.stage"] != "report")
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
        assert {"test_ppl", "test_word_ppl", "test_bpb", "test_loss", "valid_ppl", "tokens_per_sec",
                "n_params"} <= set(trained.data.metrics)  # score@ logged into the model's own run
    study_artifacts = {a.path for a in client.list_artifacts(studies[0].info.run_id, "report")}
    assert {"report/study.md", "report/study.html"} <= study_artifacts
    for stage, mlflow_run in stages.items():
        flow_run = requests.get(f"{prefect_api}/flow_runs/{mlflow_run.data.tags['prefect.flow_run_id']}", timeout=10)
        assert flow_run.status_code == 200
        assert flow_run.json()["state_type"] == "COMPLETED"
        flow = requests.get(f"{prefect_api}/flows/{flow_run.json()['flow_id']}", timeout=10).json()
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
        "strategy", "max_new_tokens", "temperature", "top_k", "top_p", "typical_p", "beam_size", "seed"]
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
    for model in MODELS:  # the study's first versions are the champions, and the newest the challengers
        assert str(client.get_model_version_by_alias(f"lmpipe-{model}", "champion").version) == "1"
        assert str(client.get_model_version_by_alias(f"lmpipe-{model}", "challenger").version) == "1"
    by_alias = run(["lmpipe", "generate", "--model", "models:/lmpipe-gru@champion", "--prompt", "The history of",
                    "--max-new-tokens", "5"], copy, env)
    assert by_alias.stdout.startswith("The history of")
    missing = run(["lmpipe", "generate", "--model", "models:/lmpipe-lstm/99", "--prompt", "The"], copy, env, check=False)
    assert missing.returncode == 1 and missing.stderr.strip().splitlines() == [
        "loading models:/lmpipe-lstm/99 from the MLflow registry ...",
        f"error: models:/lmpipe-lstm/99: not in the MLflow model registry at sqlite:///{copy}/mlflow.db "
        "(RESOURCE_DOES_NOT_EXIST; see the versions with `lmpipe ui`, Models)"]


def start_serving(copy: Path, env: dict, *args: str) -> tuple[subprocess.Popen, str, Path]:
    """`lmpipe serve --model gru` on a free port, once it answers /ping: (process, its URL, its log)."""
    import time

    from tests.conftest import free_port

    port, log = free_port(), copy / f"serve-{time.monotonic_ns()}.log"
    with open(log, "wb") as out:
        server = subprocess.Popen(["lmpipe", "serve", "--model", "gru", "--port", str(port), *args], cwd=copy, env=env,
                                  stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 120
    while True:
        try:
            if requests.get(f"{url}/ping", timeout=2).ok:
                return server, url, log
        except requests.ConnectionError:
            if server.poll() is not None or time.monotonic() > deadline:
                stop(server)
                raise AssertionError(f"lmpipe serve did not start:\n{log.read_text()[-3000:]}") from None
            time.sleep(0.5)


@pytest.fixture(scope="module")
def served(project):
    """One `lmpipe serve --model gru` (the champion) for the tests that only send it requests."""
    copy, env, _ = project
    server, url, log = start_serving(copy, env)
    yield server, url, log
    stop(server)


def test_the_champion_answers_prompts_over_http_and_bad_input_is_a_400_of_one_reason(project, served):
    """`lmpipe serve` on 127.0.0.1 (MLflow's scoring protocol, in process): text in, the same text `lmpipe generate`
    prints out."""
    copy, env, _ = project
    server, url, log = served
    body = {"inputs": {"prompt": ["The history of", "In 1990"]}, "params": {"strategy": "greedy", "max_new_tokens": 6}}
    answer = requests.post(f"{url}/invocations", json=body, timeout=60)
    assert answer.status_code == 200, log.read_text()[-2000:]
    served_text = [p["continuation"] for p in answer.json()["predictions"]]
    printed = run(["lmpipe", "generate", "--model", "models:/lmpipe-gru@champion", "--prompt", "The history of",
                   "--strategy", "greedy", "--max-new-tokens", "6"], copy, env).stdout
    assert len(served_text) == 2 and printed == "The history of" + served_text[0] + "\n"
    for params, reason in (({"strategy": "nucleus"}, "strategy must be one of greedy, beam, top-k, top-p, typical, "
                            "sample"),
                           ({"max_new_tokens": 0}, "max_new_tokens must be a whole number from 1 to 1024"),
                           ({"max_new_tokens": 1025}, "max_new_tokens must be a whole number from 1 to 1024")):
        bad = requests.post(f"{url}/invocations", json={"inputs": {"prompt": ["The"]}, "params": params}, timeout=60)
        assert bad.status_code == 400 and bad.json() == {"error_code": "BAD_REQUEST", "message": reason}, bad.text
    assert requests.post(f"{url}/invocations", json={"inputs": {"text": ["The"]}}, timeout=60).status_code == 400
    assert requests.get(f"{url}/version", timeout=10).json()["version"] == "1"


MB = "x" * 1_000_000
JSON = {"Content-Type": "application/json"}
HOSTILE = [  # (what, the request's keyword arguments, the status it must get)
    ("a 1 MB prompt", {"json": {"inputs": {"prompt": [MB]}, "params": {"max_new_tokens": 1}}}, 413),
    ("a 2 MB body", {"json": {"inputs": {"prompt": [MB * 2]}}}, 413),
    ("a 2 MB chunked body", {"data": iter([b"x" * 65536] * 32), "headers": JSON}, 413),
    ("a 50 MB body", {"data": b"x" * (50 << 20), "headers": JSON}, 413),
    ("a prompt of 6000 tokens", {"json": {"inputs": {"prompt": ["The history of " * 2000]}}}, 413),
    ("17 prompts", {"json": {"inputs": {"prompt": ["The"] * 17}}}, 413),
    ("16 prompts of 1024 new tokens", {"json": {"inputs": {"prompt": ["The"] * 16}, "params": {"max_new_tokens": 1024}}},
     413),
    ("a prompt that is a dict", {"json": {"inputs": {"prompt": {"The": "history"}}}}, 400),
    ("a prompt that is a number", {"json": {"inputs": {"prompt": 5}}}, 400),
    ("an empty list", {"json": {"inputs": {"prompt": []}}}, 400),
    ("a list of numbers", {"json": {"inputs": {"prompt": [1, 2]}}}, 400),
    ("no Content-Type", {"data": json.dumps({"inputs": {"prompt": ["The"]}})}, 415),
    ("a 1 MB body without Content-Type", {"data": MB}, 415),
    ("not JSON", {"data": b"{nope", "headers": JSON}, 400),
    ("an unknown field", {"json": {"inputs": {"prompt": ["The"]}, "temperature": 0.5}}, 400),
    ("an unknown param", {"json": {"inputs": {"prompt": ["The"]}, "params": {"temprature": 0.5}}}, 400),
    ("a bad temperature", {"json": {"inputs": {"prompt": ["The"]}, "params": {"temperature": -1}}}, 400),
    ("max_new_tokens a string", {"json": {"inputs": {"prompt": ["The"]}, "params": {"max_new_tokens": "9" * 5000}}}, 400),
]


def test_every_hostile_request_is_a_4xx_of_one_line_within_a_second_and_the_server_stays_small(served):
    """The operator's table (issue #37): each bad request is refused in one line that does not quote it, within
    1 s, before any model work; the server's peak memory stays under 2 GB and it answers good requests after."""
    import time

    server, url, log = served
    failures = []
    for what, request, status in HOSTILE:
        start = time.monotonic()
        answer = requests.post(f"{url}/invocations", timeout=30, **request)
        took = time.monotonic() - start
        if answer.status_code != status or took >= 1 or len(answer.content) > 300 or "\n" in answer.json()["message"]:
            failures.append(f"{what}: {answer.status_code} in {took:.2f} s, {answer.text[:300]}")
    assert not failures, "\n".join(failures)
    peak = next(int(line.split()[1]) for line in Path(f"/proc/{server.pid}/status").read_text().splitlines()
                if line.startswith("VmHWM:"))  # kB
    assert peak < 2 * 1024 * 1024, f"lmpipe serve peaked at {peak / 1024:.0f} MB"
    good = requests.post(f"{url}/invocations", json={"inputs": {"prompt": ["The"]}, "params": {"max_new_tokens": 2}},
                         timeout=60)
    assert good.status_code == 200 and len(good.json()["predictions"]) == 1
    assert "Traceback" not in log.read_text()


def test_sigterm_stops_the_server_at_once_and_frees_its_port(project):
    """SIGTERM to `lmpipe serve` itself (not its group), while it generates: it ends within seconds without a
    traceback, nothing of it answers any more, and the port can be bound again."""
    import signal
    import socket
    import time

    copy, env, _ = project
    server, url, log = start_serving(copy, env)
    long = {"inputs": {"prompt": ["The history of " * 100] * 16}, "params": {"max_new_tokens": 1024}}
    threading.Thread(target=lambda: requests.post(f"{url}/invocations", json=long, timeout=60), daemon=True).start()
    time.sleep(1)
    assert requests.get(f"{url}/ping", timeout=1).ok  # it answers while it generates
    start = time.monotonic()
    server.send_signal(signal.SIGTERM)
    try:
        code = server.wait(timeout=10)
    except subprocess.TimeoutExpired:
        stop(server)
        raise AssertionError(f"lmpipe serve still ran 10 s after SIGTERM:\n{log.read_text()[-2000:]}") from None
    output = log.read_text()
    assert code == 0 and time.monotonic() - start < 10, output[-2000:]
    assert "Traceback" not in output and output.rstrip().splitlines()[-1].startswith("stopped"), output[-2000:]
    with pytest.raises(ProcessLookupError):
        os.killpg(server.pid, 0)  # no process of its group is left
    port = int(url.rsplit(":", 1)[1])
    with socket.socket() as again:  # as a server binds (SO_REUSEADDR): only a listener would stop it
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("127.0.0.1", port))
        again.listen()


def test_serving_an_unknown_alias_or_version_is_one_line_naming_what_exists(project):
    copy, env, _ = project
    for alias, missing in (("99", "version 99"), ("best", "alias best")):
        done = run(["lmpipe", "serve", "--model", "gru", "--alias", alias], copy, env, check=False)
        uri = f"models:/lmpipe-gru/{alias}" if alias.isdigit() else f"models:/lmpipe-gru@{alias}"
        assert done.returncode == 1 and done.stdout == "", done.stdout + done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {uri}: lmpipe-gru has no {missing}: its versions are 1")
        assert "champion (version 1)" in lines[0] and "challenger (version" in lines[0], lines[0]


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

    from tests.conftest import free_port

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


def created_flow_run(url: str, patience: float = 60.0) -> str:
    """POST create_flow_run until the server accepts it: a busy SQLite server answers 5xx for a moment."""
    import time

    deadline = time.monotonic() + patience
    while True:
        answer = requests.post(url, json={}, timeout=10)
        if answer.ok or time.monotonic() > deadline:
            assert answer.ok, f"{answer.status_code}: {answer.text[:500]}"
            return answer.json()["id"]
        time.sleep(2)


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
            runs = requests.post(f"{prefect_api}/flow_runs/filter", timeout=10, json={
                "deployments": {"name": {"any_": ["e2e-interval"]}}, "sort": "EXPECTED_START_TIME_ASC"}).json()
            seen |= {r["state_type"] for r in runs}
            found = next((r for r in runs if r["state_type"] in ("COMPLETED", "FAILED", "CRASHED")), None)
            if found:
                break
            time.sleep(2)
        assert found, f"no scheduled run finished in 300 s (states seen: {seen})\n" + \
            (copy / "schedule.log").read_text()[-3000:]
        assert found["auto_scheduled"] and found["state_type"] == "COMPLETED", found["state"]
        artifacts = requests.post(f"{prefect_api}/artifacts/filter", timeout=10,
                                  json={"artifacts": {"flow_run_id": {"any_": [found["id"]]}}}).json()
        assert any("nothing to retrain" in (a.get("data") or "") for a in artifacts)
        assert retrain_runs(copy)[0].data.tags["lmpipe.retrain.decision"] == "unchanged"
    finally:
        stop(serve)
        log.close()
        for deployment in requests.post(f"{prefect_api}/deployments/filter", timeout=10,
                                        json={"deployments": {"name": {"any_": ["e2e-interval"]}}}).json():
            requests.delete(f"{prefect_api}/deployments/{deployment['id']}", timeout=10)  # and its runs ahead
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
            found = requests.post(f"{prefect_api}/deployments/filter",
                                  json={"deployments": {"name": {"any_": ["e2e-retrain"]}}}, timeout=10).json()
            deployment = found[0] if found else time.sleep(1)
        assert deployment, (copy / "schedule.log").read_text()[-2000:]
        assert [s["schedule"]["cron"] for s in deployment["schedules"]] == ["0 3 * * 1"]
        run_id = created_flow_run(f"{prefect_api}/deployments/{deployment['id']}/create_flow_run")
        deadline, state = time.monotonic() + 400, None
        while time.monotonic() < deadline:
            state = requests.get(f"{prefect_api}/flow_runs/{run_id}", timeout=10).json()["state_type"]
            if state in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
                break
            time.sleep(2)
        detail = requests.get(f"{prefect_api}/flow_runs/{run_id}", timeout=10).json()["state"]
        assert state == "COMPLETED", f"{detail}\n" + (copy / "schedule.log").read_text()[-3000:]
        artifacts = requests.post(f"{prefect_api}/artifacts/filter",
                                  json={"artifacts": {"flow_run_id": {"any_": [run_id]}}}, timeout=10).json()
        assert any("nothing to retrain" in (a.get("data") or "") for a in artifacts)  # same corpus, same code
        assert json.loads(run(["dvc", "status", "--json", "dvc.yaml"], copy, env).stdout) == {}  # nothing left to do
        assert (deployment["global_concurrency_limit"] or {}).get("limit") == 1, deployment
        assert deployment["concurrency_options"]["collision_strategy"] == "CANCEL_NEW"
        both = [created_flow_run(f"{prefect_api}/deployments/{deployment['id']}/create_flow_run") for _ in range(2)]
        deadline, states = time.monotonic() + 400, []
        while time.monotonic() < deadline:  # two firings at once: one retrains, the other is cancelled
            states = sorted(requests.get(f"{prefect_api}/flow_runs/{r}", timeout=10).json()["state_type"] for r in both)
            if all(s in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED") for s in states):
                break
            time.sleep(2)
        assert states == ["CANCELLED", "COMPLETED"], (copy / "schedule.log").read_text()[-3000:]
    finally:
        stop(serve)
        log.close()
    served = (copy / "schedule.log").read_text()
    assert "stopped serving 'retrain/e2e-retrain'" in served and "never awaited" not in served, served[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("runner", ["dask", "ray"])
def test_study_flow_trains_the_models_in_parallel_on_a_local_cluster(scratch, prefect_api, runner):
    """orchestration.task_runner=dask|ray: train stages run as overlapping tasks on a 127.0.0.1 cluster, DVC stays exact."""
    from datetime import datetime

    if runner == "ray":
        pytest.importorskip("prefect_ray", reason="the optional [ray] extra is not installed")
    copy, env = scratch
    retrained = ("gru", "transformer")  # two train stages stale: two tasks for the two workers, half the minutes of five
    before = {m: json.loads((copy / f"metrics/train/{m}.json").read_text()) for m in retrained}
    params = copy / "params.yaml"
    override(params, {"orchestration": {"task_runner": runner, "workers": 2}})
    for model in retrained:  # make their train stages stale and really train again (no resumable checkpoint)
        shutil.rmtree(copy / f"models/{model}")
    shutil.rmtree(copy / ".cache/lmpipe/ckpt", ignore_errors=True)
    done = run([sys.executable, "-m", "flows.study"], copy, env)
    assert json.loads(run(["dvc", "status", "--json", "dvc.yaml"], copy, env).stdout) == {}  # dvc.lock records the tasks
    for model in retrained:
        after = json.loads((copy / f"metrics/train/{model}.json").read_text())
        assert after["valid_ppl"] == pytest.approx(before[model]["valid_ppl"], rel=1e-4)
        assert (copy / f"models/{model}/model.pt").exists()
    flow_runs = requests.post(f"{prefect_api}/flow_runs/filter", json={
        "flows": {"name": {"any_": ["train-models"]}}, "sort": "START_TIME_DESC", "limit": 50}, timeout=10).json()
    models_run = [r for r in flow_runs if r["state_type"] == "COMPLETED"]
    assert models_run, done.stdout[-2000:]
    tasks = requests.post(f"{prefect_api}/task_runs/filter", json={
        "flow_runs": {"id": {"any_": [models_run[0]["id"]]}}, "limit": 50}, timeout=10).json()
    spans = sorted((datetime.fromisoformat(t["start_time"]), datetime.fromisoformat(t["end_time"]))
                   for t in tasks if t["name"].startswith("train@"))
    assert len(spans) == len(retrained)
    assert spans[1][0] < spans[0][1]  # side by side
    assert json.loads(run(["dvc", "status", "--json", "dvc.yaml"], copy, env).stdout) == {}  # orchestration is no stage param


@pytest.mark.slow
def test_torchrun_runs_a_train_stage_on_two_processes_and_dvc_commit_records_it(scratch, prefect_api):
    """The scale-out recipe: `torchrun -m flows.train` (gloo on CPU), then `dvc commit`; one tracked flow run."""
    copy, env = scratch
    env = {**env, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "flows.train",
         "--model", "gru"], copy, env)
    assert not list((copy / ".cache/lmpipe/ckpt").glob("gru-*-x2"))  # a finished run drops its checkpoints
    run(["dvc", "commit", "--force", "train@gru"], copy, env)
    assert "train@gru" not in json.loads(run(["dvc", "status", "--json", "dvc.yaml"], copy, env).stdout)
    flow_runs = requests.post(f"{prefect_api}/flow_runs/filter", json={
        "flow_runs": {"name": {"any_": ["train@gru"]}}, "sort": "START_TIME_DESC", "limit": 1}, timeout=10).json()
    assert flow_runs[0]["state_type"] == "COMPLETED"
    run(["dvc", "repro"], copy, env)  # evaluate and the rest follow the new model
    assert json.loads(run(["dvc", "status", "--json", "dvc.yaml"], copy, env).stdout) == {}


def ran_stages(output: str) -> set[str]:
    import re

    return set(re.findall(r"Running stage '([^']+)'", output))


def all_status(copy, env) -> dict:
    """`dvc status` of the study, the scaling grid and the seed spread."""
    return {pipeline: json.loads(run(["dvc", "status", "--json", pipeline], copy, env).stdout)
            for pipeline in ("dvc.yaml", "scaling/dvc.yaml", "seeds/dvc.yaml")}


@pytest.mark.slow
def test_an_added_model_is_evaluated_audited_and_reported_and_removing_it_leaves_no_trace(scratch):
    """The core promise: the results always cover exactly params.yaml's models. Adding one trains and scores only
    it (the joins follow); removing it leaves the workspace as it was, as `dvc remove` would."""
    copy, env = scratch
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    run(git + ["add", "-A"], copy, env)
    run(git + ["commit", "-qm", "studied"], copy, env)
    params = copy / "params.yaml"
    original, before, status_before = params.read_text(), json.loads((copy / "metrics/eval.json").read_text()), \
        all_status(copy, env)
    assert status_before["dvc.yaml"] == {} and status_before["seeds/dvc.yaml"] == {}
    tree = yaml.safe_load(original)
    tree["models"]["grusmall"] = {**tree["models"]["gru"], "arch": {**tree["models"]["gru"]["arch"], "emb": 8}}
    params.write_text(yaml.safe_dump(tree, sort_keys=False))
    added = run(["dvc", "repro"], copy, env)
    assert ran_stages(added.stdout) == {"train@grusmall", "score@grusmall", "evaluate", "combine", "audit", "report"}
    assert "grusmall" in json.loads((copy / "metrics/eval.json").read_text())["models"]
    assert "grusmall" in json.loads((copy / "metrics/weat.json").read_text())["models"]
    assert has_row((copy / "reports/study.md").read_text(), "grusmall")
    assert "grusmall+ngram" in json.loads((copy / "metrics/combine.json").read_text())["models"]
    assert "metrics/models/grusmall.json" in run(["dvc", "metrics", "show", "--json"], copy, env).stdout
    assert all_status(copy, env) == status_before  # the scaling grid does not read the study's other models
    untracked = run(["git", "status", "--porcelain", "--untracked-files=all"], copy, env).stdout.splitlines()
    assert sorted(line[3:] for line in untracked if line.startswith("??")) == [
        "metrics/eval/grusmall.json", "metrics/models/grusmall.json", "metrics/train/grusmall.json",
        "plots/train/grusmall.csv"]  # the model and its log-probabilities are DVC's, ignored by git

    users = {"plots/train/my_baseline.csv": "epoch,valid_bpb\n1,9\n", "metrics/eval/my_notes.json": "{}"}
    for name, text in users.items():  # a user's files beside the outputs, named after no model
        (copy / name).write_text(text)
    params.write_text(original)
    removed = run(["dvc", "repro"], copy, env)
    assert ran_stages(removed.stdout) == {"evaluate", "combine", "audit", "report"}
    assert all((copy / name).read_text() == text for name, text in users.items())  # only what dvc.lock recorded went
    assert json.loads((copy / "metrics/eval.json").read_text())["models"] == before["models"]  # the same numbers
    assert "grusmall" not in json.loads((copy / "metrics/weat.json").read_text())["models"]
    assert "grusmall" not in (copy / "reports/study.md").read_text()
    assert "grusmall" not in (copy / "metrics/combine.json").read_text()
    assert "grusmall" not in run(["dvc", "metrics", "show", "--json"], copy, env).stdout
    assert all_status(copy, env) == status_before
    for leftover in ("models/grusmall", "data/logprobs/grusmall.npz"):  # as `dvc remove` leaves it
        assert not (copy / leftover).exists(), leftover
    registered = MlflowClient(f"sqlite:///{copy / 'mlflow.db'}").get_registered_model("lmpipe-grusmall")
    assert not registered.aliases and "lmpipe.retired" in registered.tags  # no champion of a model the study dropped
    changed = run(["git", "status", "--porcelain", "--untracked-files=all"], copy, env).stdout.splitlines()
    assert [line for line in changed if not line[3:].startswith(("reports/", "mlruns/", "dvc.lock"))
            and line[3:] not in users] == []  # no trace left
    assert (copy / "dvc.lock").read_text().startswith("schema: '2.0'")

    def lock(text: str) -> dict:  # the folders holding the user's files are deps: their hashes took those files in
        stages = yaml.safe_load(text)["stages"]
        return {name: {**stage, "deps": [d for d in stage.get("deps", []) if d["path"] not in ("metrics/eval",
                                                                                           "plots/train")],
                       "outs": [o for o in stage.get("outs", []) if not o["path"].startswith("reports/")]}
                for name, stage in stages.items()}
    assert lock((copy / "dvc.lock").read_text()) == lock(run(["git", "show", "HEAD:dvc.lock"], copy, env).stdout)


def test_a_changed_arch_default_makes_dvc_status_name_the_stages_it_affects(scratch):
    """A default that decides an output lives where DVC sees it: params.yaml states every setting (lmpipe/config.py
    has no defaults), and the arch defaults live in lmpipe/families.py, a dependency of what builds a model (and of
    nothing else: the stages that only read params do not re-run)."""
    copy, env = scratch
    families = copy / "lmpipe/families.py"
    families.write_text(families.read_text().replace("dropout_hidden: float = Field(0.0,",
                                                     "dropout_hidden: float = Field(0.3,"))
    changed = set(json.loads(run(["dvc", "status", "--json", "dvc.yaml"], copy, env).stdout))
    assert {"train@rnn", "train@lstm", "train@gru", "score@gru", "audit"} <= changed
    assert not changed & {"download", "prepare", "validate", "tokenize", "ngram", "word2vec"}


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
    assert "test" in newest.data.tags["mlflow.note.content"] and newest.data.metrics["train_tflops"] > 0


@pytest.mark.slow
def test_a_store_without_the_runs_of_skipped_stages_gets_them_and_nothing_else_changes(committed):
    """A fresh clone: DVC skips evaluate, combine and report (git holds their outputs), so `make study`'s last step
    (flows/record.py) runs them again for MLflow; the same bytes come out, and a second time nothing runs."""
    copy, env = committed
    client = MlflowClient(f"sqlite:///{copy / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("lmpipe").experiment_id
    skipped = ("evaluate", "combine", "report")
    for stage in skipped:  # the clone's store has the models' runs (they trained) but none of these
        for found in client.search_runs([experiment], f"tags.`lmpipe.stage` = '{stage}'"):
            client.delete_run(found.info.run_id)
    gru = client.search_runs([experiment], "tags.`lmpipe.stage` = 'train@gru'",
                             order_by=["attributes.start_time DESC"])[0]
    client.delete_tag(gru.info.run_id, "mlflow.note.content")
    before = workspace(copy)
    said = run([sys.executable, "-m", "flows.record"], copy, env).stdout
    assert [line.split(":")[0] for line in said.splitlines() if "DVC skipped it" in line] == list(skipped)
    assert workspace(copy) == before and run(["dvc", "status", "--json", "dvc.yaml"], copy, env).stdout.strip() == "{}"
    for stage in skipped:
        assert len(client.search_runs([experiment], f"tags.`lmpipe.stage` = '{stage}'")) == 1, stage
    assert "test" in client.get_run(gru.info.run_id).data.tags["mlflow.note.content"]  # the report's description
    assert "DVC skipped it" not in run([sys.executable, "-m", "flows.record"], copy, env).stdout


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


@pytest.fixture
def committed(project, tmp_path):
    """A copy of the studied project with its MLflow store (so its champions), everything committed: a retrain
    commits on top of HEAD, and the test can tell what changed."""
    copy, env, _ = project
    target = tmp_path / "project"
    shutil.copytree(copy, target, symlinks=True)
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    run(git + ["add", "-A"], target, env)
    run(git + ["commit", "-qm", "studied"], target, env)
    return target, env


def workspace(copy: Path) -> dict:
    """What users read: HEAD, the tracked files' state, the models and the metrics."""
    return {"head": run(["git", "rev-parse", "HEAD"], copy, os.environ).stdout.strip(),
            "status": run(["git", "status", "--porcelain"], copy, os.environ).stdout,
            "models": {m: sha256_tree(copy / f"models/{m}") for m in MODELS},
            "eval": (copy / "metrics/eval.json").read_text(), "lock": (copy / "dvc.lock").read_text()}


def champions(copy: Path) -> dict:
    client = MlflowClient(f"sqlite:///{copy / 'mlflow.db'}")
    return {m: str(client.get_model_version_by_alias(f"lmpipe-{m}", "champion").version) for m in MODELS}


def retrain_runs(copy: Path) -> list:
    client = MlflowClient(f"sqlite:///{copy / 'mlflow.db'}")
    exp = client.get_experiment_by_name("lmpipe")
    return client.search_runs([exp.experiment_id], "tags.`lmpipe.driver` = 'retrain'",
                              order_by=["attributes.start_time DESC"])


PREFECT_LOG = re.compile(r"\d\d:\d\d:\d\d\.\d+ \| ")  # a line of Prefect's console log: '01:43:20.925 | INFO | ...'


def newest_flow_run_state(prefect_api: str, flow_name: str) -> str:
    """The state of the flow's newest run that started (a schedule's future runs, created ahead, do not count)."""
    runs = requests.post(f"{prefect_api}/flow_runs/filter", timeout=10, json={
        "flows": {"name": {"any_": [flow_name]}}, "sort": "START_TIME_DESC", "limit": 1,
        "flow_runs": {"start_time": {"is_null_": False}}}).json()
    return runs[0]["state_type"]


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
    runs = requests.post(f"{prefect_api}/flow_runs/filter", timeout=10, json={
        "deployments": {"name": {"any_": ["e2e-sigterm"]}}}).json()
    assert runs and not [r for r in runs if r["state_type"] in ("RUNNING", "PENDING")], [r["state"] for r in runs]
    for deployment in requests.post(f"{prefect_api}/deployments/filter", timeout=10,
                                    json={"deployments": {"name": {"any_": ["e2e-sigterm"]}}}).json():
        requests.delete(f"{prefect_api}/deployments/{deployment['id']}", timeout=10)


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
            runs = requests.post(f"{prefect_api}/flow_runs/filter", timeout=10, json={
                "deployments": {"name": {"any_": ["e2e-dirty"]}}}).json()
            failed = [r for r in runs if r["state_type"] == "FAILED"]
            time.sleep(2)
        assert failed, (copy / "schedule.log").read_text()[-3000:]
        time.sleep(25)  # two more intervals: a paused schedule fires no more
        runs = requests.post(f"{prefect_api}/flow_runs/filter", timeout=10, json={
            "deployments": {"name": {"any_": ["e2e-dirty"]}}}).json()
        (deployment,) = requests.post(f"{prefect_api}/deployments/filter", timeout=10,
                                      json={"deployments": {"name": {"any_": ["e2e-dirty"]}}}).json()
    finally:
        stop(serve)
        log.close()
    assert [r["state_type"] for r in runs if r["state_type"] in ("FAILED", "COMPLETED", "RUNNING")] == ["FAILED"]
    assert deployment["paused"]
    message = failed[0]["state"]["message"]
    assert "`git checkout -- dvc.lock metrics/weat.json`" in message and "is paused" in message, message
    assert "`git checkout -- dvc.lock metrics/weat.json`" in (copy / "schedule.log").read_text()
    requests.delete(f"{prefect_api}/deployments/{deployment['id']}", timeout=10)


@pytest.mark.slow
def test_the_train_stage_gives_each_branch_budget_as_its_standalone_run(scratch):
    """study.branches: the train stage also gives the model's annealed result at C/k, one record per budget, the run at
    C last; the branch at C/2 is the run `python -m lmpipe.train --budget` gives at C/2, to the last digit; `lmpipe
    seeds` gives every seed's branches, so each budget has a seed spread."""
    copy, env = scratch
    params = yaml.safe_load((copy / "params.yaml").read_text())
    flops = 3e9
    params["study"] = {"budget": {"flops": flops}, "branches": [4, 2]}
    gru = {k: v for k, v in params["models"]["gru"].items() if k not in ("epochs", "patience")}
    params["models"]["gru"] = {**gru, "max_steps_per_epoch": None,
                               "optim": {**ADAMW, "lr": 0.003, "schedule": "wsd", "decay_fraction": 0.25}}
    (copy / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    run([sys.executable, "-m", "flows.train", "--model", "gru"], copy, env)
    budgets = json.loads((copy / "metrics/train/gru.json").read_text())["budgets"]
    assert [r["budget_flops"] for r in budgets] == [flops / 4, flops / 2, flops]
    assert all(abs(r["train_flops"] / r["budget_flops"] - 1) < 0.01 for r in budgets), budgets
    assert budgets[-1]["valid_bpb"] == json.loads((copy / "metrics/train/gru.json").read_text())["valid_bpb"]
    assert budgets[0]["test_bpb"] > budgets[-1]["test_bpb"]  # more compute, lower loss
    assert not list((copy / ".cache/lmpipe/ckpt").glob("gru*"))  # every branch's checkpoints discarded too
    run([sys.executable, "-m", "lmpipe.train", "--model", "gru", "--budget", f"{{flops: {flops / 2}}}", "--out", "half"],
        copy, env)
    assert json.loads((copy / "half/metrics.json").read_text())["valid_bpb"] == budgets[1]["valid_bpb"]

    run(["lmpipe", "seeds", "--models", "gru"], copy, env)  # each seed's run gives its branches too
    with open(copy / "seeds/budgets.csv") as f:
        rows = [{k: (v if k == "model" else float(v)) for k, v in r.items()} for r in csv.DictReader(f)]
    kept = {r["model"] for r in rows} - {"gru"}  # the committed study's other models keep their rows
    assert kept == {"nplm", "rnn", "lstm", "transformer"}, kept
    rows = [r for r in rows if r["model"] == "gru"]
    assert sorted((r["seed"], r["budget_flops"]) for r in rows) == sorted(
        (seed, r["budget_flops"]) for seed in (1, 2, 1234) for r in budgets)
    assert [r["test_bpb"] for r in rows if r["seed"] == 1234] == [r["test_bpb"] for r in budgets]  # the study's own
    assert all(abs(r["train_flops"] / r["budget_flops"] - 1) < 0.01 for r in rows), rows
    assert len({r["test_bpb"] for r in rows if r["budget_flops"] == flops / 4}) == 3  # the seed decides each branch
    assert not list((copy / ".cache/lmpipe/seeds/ckpt").glob("gru*"))  # the seeds' branches leave no checkpoint


@pytest.mark.slow
@pytest.mark.skipif(not (shutil.which("initdb") or list(Path("/usr/lib/postgresql").glob("*/bin/initdb"))),
                    reason="PostgreSQL's server programs are not installed (Debian: apt install postgresql-15)")
def test_a_team_shares_one_mlflow_and_prefect_on_postgresql_and_one_dvc_remote(committed, tmp_path_factory):
    """`lmpipe team up`; clone A records its study on the team's servers and pushes to the remote; clone B, a fresh
    clone, pulls and reproduces without training; B's retrain registers a version A sees; `team down` leaves no
    server behind."""
    import tempfile

    from tests.conftest import free_port

    a, env = committed
    folder = Path(tempfile.mkdtemp(prefix="lmpipe-team-", dir="/tmp"))  # PostgreSQL's own user must reach it
    folder.chmod(0o755)
    ports = {"postgres": free_port(), "mlflow": free_port(), "prefect": free_port()}
    up = ["lmpipe", "team", "up", "--dir", str(folder / "team")] + [f"--{k}-port={v}" for k, v in ports.items()]
    try:
        said = run(up, a, env, timeout=600).stdout
        exports = dict(re.findall(r"export (\w+)=(\S+)", said))
        assert exports == {"MLFLOW_TRACKING_URI": f"http://127.0.0.1:{ports['mlflow']}",
                           "PREFECT_API_URL": f"http://127.0.0.1:{ports['prefect']}/api"}, said
        remote = re.search(r"dvc remote add --local --force -d team (\S+)", said).group(1)
        team = {**env, **exports}
        server = MlflowClient(exports["MLFLOW_TRACKING_URI"])
        assert run(up, a, env).stdout == said  # a second `up` finds them running

        run(["lmpipe", "check-params", "--store"], a, team)
        studied = run(["dvc", "repro", "--force", "--single-item", *STAGES], a, team, timeout=1800)  # A's study, on
        assert ran_stages(studied.stdout) == set(STAGES)                                  # the team's servers
        assert ran_stages(run([sys.executable, "-m", "flows.record"], a, team).stdout) == set()  # all on the server
        assert run(["git", "status", "--porcelain"], a, team).stdout == ""  # bit for bit, as before
        champion = {m: server.get_model_version_by_alias(f"lmpipe-{m}", "champion") for m in MODELS}
        assert all(v.tags["lmpipe.output_sha256"] == sha256_tree(a / f"models/{m}") for m, v in champion.items())
        ui = run(["lmpipe", "ui"], a, team, timeout=60).stdout  # the server is the UI: links to it, nothing started
        assert f"the models this workspace holds, best test bpb first: {exports['MLFLOW_TRACKING_URI']}/#/" in ui
        assert f"gru v{champion['gru'].version}" in ui.splitlines()[-1]
        run(["dvc", "remote", "add", "--local", "-d", "team", remote], a, team)
        run(["dvc", "push"], a, team)

        b = tmp_path_factory.mktemp("clone-b") / "b"
        run(["git", "clone", "-q", str(a), str(b)], a, team)
        run(["dvc", "remote", "add", "--local", "-d", "team", remote], b, team)
        run(["dvc", "pull"], b, team)
        assert json.loads(run(["dvc", "status", "--json", "dvc.yaml"], b, team).stdout) == {}
        assert ran_stages(run(["dvc", "repro"], b, team).stdout) == set()  # nothing trained, nothing run
        assert ran_stages(run([sys.executable, "-m", "flows.record"], b, team).stdout) == set()  # A recorded them
        assert all(sha256_tree(b / f"models/{m}") == sha256_tree(a / f"models/{m}") for m in MODELS)

        serving, url, log = start_serving(b, team)  # the champion, from the team's registry
        try:
            body = {"inputs": {"prompt": ["The history of"]}, "params": {"strategy": "greedy", "max_new_tokens": 4}}
            answer = requests.post(f"{url}/invocations", json=body, timeout=60)
            assert answer.status_code == 200 and answer.json()["predictions"][0]["continuation"], log.read_text()
        finally:
            stop(serving)
        log.unlink()  # B's tree stays clean for its retrain

        failed = run(["lmpipe", "retrain", "-S", "models.gru.optim.lr=1.0"], b, team, check=False)  # a crippled GRU
        assert failed.returncode == 1 and "regressed" in failed.stderr, failed.stderr[-2000:]
        seen_from_a = MlflowClient(exports["MLFLOW_TRACKING_URI"]).get_model_version_by_alias("lmpipe-gru", "challenger")
        assert int(seen_from_a.version) > int(champion["gru"].version)
        assert server.get_model_version_by_alias("lmpipe-gru", "champion").version == champion["gru"].version
        trained_run = server.get_run(champion["gru"].run_id).data.tags  # the flow runs are on the team's Prefect
        stage_run = requests.get(f"{exports['PREFECT_API_URL']}/flow_runs/{trained_run['prefect.flow_run_id']}",
                                 timeout=10).json()
        assert stage_run["name"] == "score@gru" and stage_run["state_type"] == "COMPLETED"
        assert newest_flow_run_state(exports["PREFECT_API_URL"], "retrain") == "FAILED"
    finally:
        down = run(["lmpipe", "team", "down", "--dir", str(folder / "team")], a, env, check=False)
    assert down.returncode == 0 and down.stdout.startswith("stopped: prefect, mlflow, postgres"), down.stderr
    from flows.server import port_free

    assert all(port_free(p) for p in ports.values())
    left = run(["pgrep", "-f", str(folder)], a, env, check=False).stdout
    assert left == "", left
    shutil.rmtree(folder, ignore_errors=True)
