"""The experiments beside the study, on its tiny copy: the scaling grid, the seed spread and the train stage's
budget branches."""

from __future__ import annotations

import csv
import json
import re
import sys

import pytest
import yaml
from mlflow.tracking import MlflowClient

from tests.helpers import ADAMW, MODELS, ran_stages, run, table_rows

pytestmark = pytest.mark.e2e
# `make test` runs on pytest-xdist's workers (tests/conftest.py): these tests form a group of their own,
# which a second worker runs beside a second copy of the study.
SECOND_STUDY = ("test_scaling_pipeline_trains_its_grid_to_budget_fits_and_reports",
                "test_seeds_retrain_every_model_and_the_report_gives_mean_sd_and_verdicts")


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
        assert set(fit["law"]) == {"E", "A", "alpha", "B", "beta"}
        usable = not (fit["law_fit"] or {}).get("rejected") and not fit["law_degenerate"]  # a rejected law predicts nothing
        assert set(fit["predictions"]) == ({"10x", "100x"} if usable else set()), (fit["law_fit"], fit["predictions"])
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
    study = run(["dvc", "repro"], copy, env)  # the report (and publish, which logs it): the grid is current now,
    assert ran_stages(study.stdout) == {"report", "publish"}  # but shares no budget
    assert re.search(r"The scaling grid \(reports/scaling\.md: lstm, transformer at 4 budgets from 2\.00e\+08 to "
                     r"1\.60e\+09 FLOPs, .*\): not compared, as the study has no annealed result at its budgets",
                     (copy / "reports/study.md").read_text())


@pytest.mark.slow
def test_seeds_retrain_every_model_and_the_report_gives_mean_sd_and_verdicts(scratch):
    """`lmpipe seeds`: every model at each seed of seeds.extra beside the study's own run, in seeds/seeds.csv and
    committed to its frozen DVC stage; the study's repro then re-runs the report, which gives mean ± sd, and publish; a
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
    assert ran_stages(after.stdout) == {"report", "publish"}
    section = (copy / "reports/study.md").read_text().split("## Seeds and verdicts")[1]
    for model in MODELS:
        assert f"- **{model}**: test " in section and "(3 seeds)" in section
    assert "Stale" not in section
    (summary,) = (copy / "metrics/models").glob("*-gru.json")
    assert json.loads(summary.read_text())["sd"] > 0  # `dvc metrics show` gives the sd

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
