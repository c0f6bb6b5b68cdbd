"""The study's `dvc repro` in a temporary git copy of the project, on a few real articles (the `project`
fixture, tests/conftest.py): every stage's outputs, and what a change to params, code or the models re-runs."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import yaml
from mlflow.tracking import MlflowClient

from lmpipe.ngram import NGramLM

from tests.helpers import MODELS, STAGES, has_row, override, ran_stages, run

pytestmark = pytest.mark.e2e


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
    listed = [line.split()[1] for line in shown if line.startswith("| metrics/")]  # a row per model, nothing else
    bpb = {m: r["test"]["bpb"] for m, r in json.loads((copy / "metrics/eval.json").read_text())["models"].items()}
    assert listed == [f"metrics/models/{rank}-{m}.json"  # best first (the seeds' means are of the same runs here)
                      for rank, m in enumerate(sorted(bpb, key=lambda m: (bpb[m], m)), 1)]
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
    assert len(specs) == 3  # the learning curves (a panel a model), all of them against FLOPs, the perplexity dots
    together = [s for s in specs if s.get("encoding", {}).get("x", {}).get("field") == "flops"]
    assert len(together) == 1 and together[0]["encoding"]["color"]["field"] == "model"
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


def test_changed_params_rerun_only_what_depends_on_them(scratch):  # its own copy: it edits params.yaml
    copy, env = scratch
    params = copy / "params.yaml"
    saved = params.read_text()
    try:
        override(params, {"tokenizer": {"vocab_size": 700}})
        status = run(["dvc", "status", "--json", "dvc.yaml"], copy, env)
        # the rest follows once tokens change; the report and the registry cards (publish) name params.yaml's
        # sha256, so any edit re-makes them
        assert set(json.loads(status.stdout)) == {"tokenize", "report", "publish"}
        params.write_text(saved)
        changed = yaml.safe_load(saved)
        changed["models"]["gru"]["arch"]["emb"] = 24
        params.write_text(yaml.safe_dump(changed, sort_keys=False))
        status = run(["dvc", "status", "--json", "dvc.yaml"], copy, env)
        assert set(json.loads(status.stdout)) == {"train@gru", "evaluate", "combine", "audit", "report",
                                                  "publish"}  # read `models`
    finally:
        params.write_text(saved)


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
    assert ran_stages(added.stdout) == {"train@grusmall", "score@grusmall", "evaluate", "combine", "audit", "report",
                                        "publish"}
    assert "grusmall" in json.loads((copy / "metrics/eval.json").read_text())["models"]
    assert "grusmall" in json.loads((copy / "metrics/weat.json").read_text())["models"]
    assert has_row((copy / "reports/study.md").read_text(), "grusmall")
    assert "grusmall+ngram" in json.loads((copy / "metrics/combine.json").read_text())["models"]
    assert "-grusmall.json" in run(["dvc", "metrics", "show", "--json"], copy, env).stdout
    assert all_status(copy, env) == status_before  # the scaling grid does not read the study's other models
    untracked = run(["git", "status", "--porcelain", "--untracked-files=all"], copy, env).stdout.splitlines()
    new = sorted(line[3:] for line in untracked if line.startswith("??"))
    assert [n for n in new if not n.startswith("metrics/models/")] == [  # its summary's rank renames others there
        "metrics/eval/grusmall.json", "metrics/train/grusmall.json",
        "plots/train/grusmall.csv"]  # the model and its log-probabilities are DVC's, ignored by git
    assert any(n.endswith("-grusmall.json") for n in new)

    users = {"plots/train/my_baseline.csv": "epoch,valid_bpb\n1,9\n", "metrics/eval/my_notes.json": "{}"}
    for name, text in users.items():  # a user's files beside the outputs, named after no model
        (copy / name).write_text(text)
    params.write_text(original)
    removed = run(["dvc", "repro"], copy, env)
    assert ran_stages(removed.stdout) - {"publish"} == {"evaluate", "combine", "audit", "report"}
    # publish's inputs are again the first study's, so DVC may restore its output from its run cache instead; either
    # way metrics/models is the first study's (below), and so are the MLflow rows `lmpipe ui` finds by its hash
    assert "publish" in ran_stages(removed.stdout) or "Stage 'publish' is cached" in removed.stdout + removed.stderr
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
