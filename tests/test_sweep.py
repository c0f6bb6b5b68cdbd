"""Sweeps: the search space file, seeded and resumable Optuna studies, and the sweep flow end to end."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import optuna
import pytest
import yaml

from lmpipe import sweep as sw
from lmpipe import tuning_doc
from lmpipe.model_params import ModelParams
from lmpipe.overrides import with_overrides
from lmpipe.errors import ConfigError
from tests.helpers import ROOT, entry, project_params, table_rows

SPACE = {"m": {"budget": {"tokens": 1000}, "space": {
    "optim.lr": {"low": 1e-3, "high": 1e-1, "log": True},
    "arch.layers": {"low": 1, "high": 3},
    "batch_size": {"choices": [8, 16]}}}}


def write_space(tmp_path, spaces=SPACE) -> Path:
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(spaces))
    return path


@pytest.mark.parametrize("spaces, message", [
    ({"other": SPACE["m"]}, "no search space for 'm' (have: other)"),
    ({"m": {"budget": {"seconds": 60}, "space": SPACE["m"]["space"]}}, "m.budget must be {tokens: N} or {flops: F}"),
    ({"m": {"budget": {"tokens": 10}, "space": {"optim.lr": {"low": 1}}}}, "m.space.optim.lr needs low and high"),
])
def test_bad_space_is_one_line_naming_file_and_key(tmp_path, spaces, message):
    path = write_space(tmp_path, spaces)
    with pytest.raises(ConfigError) as error:
        sw.load_space(path, "m")
    assert str(error.value).startswith(f"{path}: ") and message in str(error.value)
    assert "\n" not in str(error.value)


def test_suggested_points_become_valid_model_settings(tmp_path):
    space = sw.load_space(write_space(tmp_path), "m")
    trial = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0)).ask()
    chosen = sw.suggest(trial, space)
    assert set(chosen) == {"optim.lr", "arch.layers", "batch_size"}
    assert isinstance(chosen["arch.layers"], int) and 1e-3 <= chosen["optim.lr"] <= 1e-1
    base = ModelParams(**entry("rnn", {"cell": "gru", "emb": 8}, epochs=3))
    settings = with_overrides(base, chosen, space.budget)
    assert settings.arch == {"cell": "gru", "emb": 8, "layers": chosen["arch.layers"]}
    assert settings.optim.lr == chosen["optim.lr"] and settings.budget.tokens == 1000
    assert sw.best_profile("m", {"optim.lr": 0.01, "batch_size": 8}) == {
        "models": {"m": {"optim": {"lr": 0.01}, "batch_size": 8}}}
    with pytest.raises(ConfigError, match=r"settings \{.arch.nonsense.: 1\}: .*arch has \[.nonsense.\]"):
        with_overrides(base, {"arch.nonsense": 1})


def bowl(trial):
    """A cheap objective with a known minimum, reported in steps so the pruner has something to compare."""
    x, k = trial.suggest_float("x", -3, 3), trial.suggest_int("k", 0, 4)
    for step in range(1, 4):
        trial.report((x - 1) ** 2 + (k - 2) ** 2 + 1 / step, step)
        if trial.should_prune():
            raise optuna.TrialPruned()
    return (x - 1) ** 2 + (k - 2) ** 2


def new_study(db: Path, name="s"):
    return optuna.create_study(study_name=name, storage=sw.storage(db), direction="minimize",
                               pruner=optuna.pruners.HyperbandPruner(min_resource=1, max_resource=3),
                               load_if_exists=True)


def test_same_seed_same_trials_and_an_interrupted_sweep_resumes_to_the_same(tmp_path):
    whole = new_study(tmp_path / "a.db")
    sw.run_sweep(whole, 12, seed=5, objective=bowl)
    interrupted = new_study(tmp_path / "b.db")
    sw.run_sweep(interrupted, 5, seed=5, objective=bowl)
    sw.run_sweep(new_study(tmp_path / "b.db"), 12, seed=5, objective=bowl)  # the same command again, more trials
    params = lambda s: [(t.params, t.state) for t in s.trials]  # noqa: E731
    assert params(new_study(tmp_path / "b.db")) == params(whole)
    assert len(whole.trials) >= 12 and whole.best_value < 1.0


def test_a_trial_that_died_is_run_again(tmp_path):
    study = new_study(tmp_path / "c.db")

    def dies(trial):
        trial.suggest_float("x", -3, 3)
        trial.suggest_int("k", 0, 4)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        sw.run_sweep(study, 3, seed=1, objective=dies)
    sw.run_sweep(new_study(tmp_path / "c.db"), 3, seed=1, objective=bowl)
    trials = new_study(tmp_path / "c.db").trials
    assert trials[0].state == optuna.trial.TrialState.FAIL
    assert trials[1].params == trials[0].params and trials[1].user_attrs["retry_of"] == 0


def test_a_space_of_choices_is_a_grid_run_once_per_point_and_resumable(tmp_path):
    space = sw.load_space(write_space(tmp_path, {"m": {"budget": {"flops": 1e9}, "prune": False, "space": {
        "optim.lr": {"choices": [0.1, 0.2, 0.4]}, "batch_size": {"choices": [8, 16]}}}}), "m")
    assert space.grid == {"optim.lr": [0.1, 0.2, 0.4], "batch_size": [8, 16]} and space.size == 6
    assert not space.prune and sw.load_space(write_space(tmp_path), "m").grid is None

    def cost(trial):
        return abs(trial.suggest_categorical("optim.lr", space.grid["optim.lr"]) - 0.2) + \
            trial.suggest_categorical("batch_size", space.grid["batch_size"]) / 100

    whole = new_study(tmp_path / "g.db")
    sw.run_sweep(whole, 6, seed=2, objective=cost, grid=space.grid)
    sw.run_sweep(new_study(tmp_path / "h.db"), 2, seed=2, objective=cost, grid=space.grid)  # interrupted after 2
    resumed = new_study(tmp_path / "h.db")
    sw.run_sweep(resumed, 6, seed=2, objective=cost, grid=space.grid)
    points = lambda s: [tuple(t.params.values()) for t in s.trials]  # noqa: E731
    assert sorted(points(whole)) == sorted((lr, b) for lr in (0.1, 0.2, 0.4) for b in (8, 16))
    assert points(resumed) == points(whole) and whole.best_params == {"optim.lr": 0.2, "batch_size": 8}


def test_every_familys_learning_rate_is_the_best_of_the_same_sweep_at_the_study_budget():
    """What params.yaml and the report claim, read from the sweeps' outcomes, not their space file: each
    model's optim.lr won one and the same sweep (three rates a factor 2 apart, around the rate params.yaml held
    then: sweeps/equal_compute.yaml), every trial trained for the study's full budget and finished."""
    import pandas as pd

    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    budget = float(params["study"]["budget"]["flops"])
    for model, entry in params["models"].items():
        trials = pd.read_csv(ROOT / "sweeps/equal_compute" / model / "trials.csv")
        lr = entry["optim"]["lr"]
        assert (trials["state"] == "COMPLETE").all() and ((trials["train_flops"] / budget - 1).abs() < 0.01).all()
        low, mid, high = sorted(trials["optim.lr"])
        assert (mid / low, high / mid) == pytest.approx((2, 2)), model
        assert trials.loc[trials["valid_bpb"].idxmin(), "optim.lr"] == pytest.approx(lr), model


def test_every_family_but_the_transformer_gets_one_run_at_half_its_width_at_the_study_budget():
    """sweeps/equal_size.yaml: the transformer's width was chosen at C between its own and half of it;
    every other family gets the same, one run at half its embedding (and hidden) width, at the study's budget (a
    family whose half width won has it in params.yaml now)."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    path = ROOT / "sweeps/equal_size.yaml"
    others = [m for m, entry in params["models"].items() if entry["family"] != "transformer"]
    for model in others:
        space, arch = sw.load_space(path, model), params["models"][model]["arch"]
        assert space.budget == {"flops": float(params["study"]["budget"]["flops"])} and space.size == 1
        assert (space.prune, space.evals_per_epoch) == (False, params["train"]["evals_per_epoch"])
        widths = [k for k in ("emb", "hidden") if k in arch]
        half = {f"arch.{k}": [arch[k] // 2] for k in widths}
        adopted = {f"arch.{k}": [arch[k]] for k in widths}  # the half width won and params.yaml took it (the NPLM)
        assert space.grid in (half, adopted), model


def test_every_recurrent_family_and_the_nplm_get_one_run_with_the_other_optimiser_at_the_study_budget():
    """sweeps/equal_optimiser.yaml: the transformer's ablations tried AdamW and Muon; every other family gets one run
    with the optimiser it does not train with (Muon for one on AdamW, AdamW for one on Muon) at its own rate, at the
    study's budget."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    path = ROOT / "sweeps/equal_optimiser.yaml"
    other = {"adamw": "muon", "muon": "adamw"}
    for model, entry in params["models"].items():
        if entry["family"] == "transformer":
            continue
        space = sw.load_space(path, model)
        assert space.budget == {"flops": float(params["study"]["budget"]["flops"])} and space.size == 1
        assert (space.prune, space.evals_per_epoch) == (False, params["train"]["evals_per_epoch"])
        assert space.grid == {"optim.name": [other[entry["optim"]["name"]]]}, model


def test_the_dropout_sweep_moves_each_recurrent_familys_dropouts_at_the_studys_budget():
    """sweeps/equal_dropout.yaml: the GRU and the LSTM get one run at C with both their dropouts (input and output)
    moved together to a value they do not train with, the RNN's; each key a setting of the family's architecture."""
    from lmpipe.families import RNNArch

    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    path = ROOT / "sweeps/equal_dropout.yaml"
    for model in ("gru", "lstm"):
        entry, space = params["models"][model], sw.load_space(path, model)
        assert space.budget == {"flops": float(params["study"]["budget"]["flops"])} and space.size == 1
        assert (space.prune, space.evals_per_epoch) == (False, params["train"]["evals_per_epoch"])
        tried = {key.removeprefix("arch."): values for key, values in space.grid.items()}
        assert tried == {"dropout": [params["models"]["rnn"]["arch"]["dropout"]],
                         "dropout_input": [params["models"]["rnn"]["arch"]["dropout_input"]]}, model
        assert all(entry["arch"][key] != values[0] for key, values in tried.items()), model
        RNNArch(**{**entry["arch"], **{k: v[0] for k, v in tried.items()}})  # settings the family has, in range


def test_a_winners_spread_has_no_sd_from_one_run_and_the_sample_sd_from_several():
    """One meaning of a single run's sd across the project (lmpipe.stats.mean_sd): none, not 0."""
    assert sw.winner_spread([2.5]) == {"mean": 2.5, "std": None, "min": 2.5, "max": 2.5, "n": 1}
    spread = sw.winner_spread([2.0, 2.2, 2.4])
    assert spread["std"] == pytest.approx(0.2) and (spread["mean"], spread["n"]) == (pytest.approx(2.2), 3)


def test_a_one_point_sweep_is_set_beside_the_studys_own_run_and_its_gap_judged_by_the_seeds(tmp_path):
    """docs/tuning.md's grid tables: the best point tried against the study's run at C (its seeds' mean and sd from
    seeds/seeds.csv), better or worse beyond noise only past twice the sd; no seeds, no comparison."""
    space_file = tmp_path / "sweeps/other.yaml"
    space_file.parent.mkdir()
    space_file.write_text(yaml.safe_dump({m: {"budget": {"flops": 3e13}, "space": {"optim.name": {"choices": ["muon"]}}}
                                          for m in ("rnn", "gru")}))
    outcomes = []
    for model, bpb in (("rnn", 2.2209), ("gru", 2.1890)):
        folder = tmp_path / "sweeps/other" / model
        folder.mkdir(parents=True)
        (folder / "trials.csv").write_text("number,state,valid_bpb,optim.name,evaluations,tokens_seen,train_flops,"
                                           f"seconds\n0,COMPLETE,{bpb},muon,8,100,3e13,1\n")
        outcomes.append((folder, space_file))
    seeds = tmp_path / "seeds.csv"
    seeds.write_text("model,seed,valid_bpb\nrnn,1,2.2608\nrnn,2,2.2681\nrnn,1234,2.2648\n"
                     "gru,1,2.1870\ngru,2,2.1920\ngru,1234,2.1895\n")
    rows = {line.split("|")[1].strip(): line for line in tuning_doc.grid_summary(outcomes, space_file, seeds)
            if line.startswith("| rnn") or line.startswith("| gru")}
    assert "2.2646 ± 0.0037 (3 seeds)" in rows["rnn"] and "-0.0437 (beyond noise: more than 2 x sd 0.0037)" in rows["rnn"]
    assert "2.1895 ± 0.0025 (3 seeds)" in rows["gru"] and "-0.0005 (within noise: not more than 2 x sd 0.0025)" in rows["gru"]
    bare = [line for line in tuning_doc.grid_summary(outcomes, space_file) if line.startswith("| rnn")]
    assert bare and "| -    " in bare[0]


V = 40


@pytest.fixture()
def tiny_project(tmp_path):
    """A project folder with a synthetic token stream, one tiny model and its search space."""
    rng = np.random.default_rng(0)
    tokens = tmp_path / "data" / "tokens"
    tokens.mkdir(parents=True)
    for name, n in (("train", 4000), ("valid", 600), ("test", 600)):
        t, out = 1, []
        for _ in range(n):
            t = (t * 7 + 3) % (V - 1) + 1 if rng.random() < 0.9 else int(rng.integers(1, V))
            out.append(t)
        np.save(tokens / f"{name}.npy", np.array(out, dtype=np.uint16))
    counts = {"vocab_size": V, "boundary_id": 0, "words": {s: 500 for s in ("train", "valid", "test")},
              "bytes": {s: 2500 for s in ("train", "valid", "test")}}
    (tokens / "counts.json").write_text(json.dumps(counts))
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(project_params(
        train={"seed": 3, "log_every": 5, "eval_chunk": 50, "evals_per_epoch": 1},
        models={"tiny": entry("nplm", {"context": 3, "emb": 8, "hidden": 16}, batch_size=8, seq_len=16, epochs=1)})))
    (tmp_path / "sweeps").mkdir()
    write_space(tmp_path / "sweeps", {"tiny": {"budget": {"tokens": 3000}, "evals_per_epoch": 8, "space": {
        "optim.lr": {"low": 1e-3, "high": 3e-2, "log": True}, "arch.hidden": {"choices": [8, 16, 32]}}}})
    return tmp_path


def sweep(project: Path, env: dict, trials: int, *args, seeds=2) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "flows.sweep", "--model", "tiny", "--trials", str(trials),
                           "--seeds", str(seeds), *args], cwd=project, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.mark.e2e
def test_sweep_flow_records_trials_in_mlflow_and_writes_its_outcome(tiny_project, prefect_api):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tiny_project / 'mlflow.db'}"
    env = {**os.environ, "PREFECT_API_URL": prefect_api, "MLFLOW_TRACKING_URI": uri,
           "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    (tiny_project / "docs").mkdir()
    sweep(tiny_project, env, 4)
    with open(tiny_project / "sweeps/tiny/trials.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4 and {r["state"] for r in rows} <= {"COMPLETE", "PRUNED"}
    assert all(int(r["tokens_seen"]) >= 3000 for r in rows if r["state"] == "COMPLETE")
    best = yaml.safe_load((tiny_project / "sweeps/tiny/best.yaml").read_text())
    winner = min((r for r in rows if r["state"] == "COMPLETE"), key=lambda r: float(r["valid_bpb"]))
    assert best["models"]["tiny"]["optim"]["lr"] == pytest.approx(float(winner["optim.lr"]))
    with open(tiny_project / "sweeps/tiny/seeds.csv") as f:
        assert [int(r["seed"]) for r in csv.DictReader(f)] == [4, 5]
    doc = (tiny_project / "docs/tuning.md").read_text()
    assert "### tiny (sweeps/tiny)" in doc and "Seed spread of the winner (3 seeds" in doc and "trials.png" in doc

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("lmpipe")
    parents = client.search_runs([experiment.experiment_id], "tags.`lmpipe.role` = 'sweep'")
    assert len(parents) == 1 and parents[0].data.metrics["best_valid_bpb"] == pytest.approx(float(winner["valid_bpb"]))
    children = client.search_runs([experiment.experiment_id],
                                  f"tags.`mlflow.parentRunId` = '{parents[0].info.run_id}'")
    roles = sorted(c.data.tags["lmpipe.role"] for c in children)
    assert roles == ["seed", "seed", "trial", "trial", "trial", "trial"]
    trial_run = next(c for c in children if c.data.tags["lmpipe.role"] == "trial")
    assert "optim.lr" in trial_run.data.params
    assert len(client.get_metric_history(trial_run.info.run_id, "valid_bpb")) >= 1

    sweep(tiny_project, env, 6)  # the same command with more trials continues the study
    with open(tiny_project / "sweeps/tiny/trials.csv") as f:
        more = list(csv.DictReader(f))
    assert len(more) == 6 and more[:4] == rows

    write_space(tiny_project / "sweeps", {"tiny": {"budget": {"tokens": 3000}, "evals_per_epoch": 8, "prune": False,
                                                    "space": {"optim.lr": {"choices": [0.003, 0.01, 0.03]}}}})
    (tiny_project / "sweeps/space.yaml").rename(tiny_project / "sweeps/grid.yaml")
    write_space(tiny_project / "sweeps", {"tiny": {"budget": {"tokens": 3000}, "space": {"optim.lr": {"low": 1e-3, "high": 3e-2}}}})
    sweep(tiny_project, env, 10, "--space", "sweeps/grid.yaml", seeds=0)  # a grid: its 3 points, whole, once each
    with open(tiny_project / "sweeps/grid/tiny/trials.csv") as f:
        grid = list(csv.DictReader(f))
    assert sorted(float(r["optim.lr"]) for r in grid) == [0.003, 0.01, 0.03]
    assert {r["state"] for r in grid} == {"COMPLETE"} and all(int(r["tokens_seen"]) >= 3000 for r in grid)
    best = min(grid, key=lambda r: float(r["valid_bpb"]))
    doc = (tiny_project / "docs/tuning.md").read_text()
    assert "## Sweeps of [sweeps/grid.yaml]" in doc and "### tiny (sweeps/tiny)" in doc  # both sweeps stay
    assert f"**{float(best['optim.lr']):g}: {float(best['valid_bpb']):.4f}**" in doc
    assert "sweeps/grid/tiny/best.yaml" in (tiny_project / "sweeps/grid/tiny/best.yaml").read_text()


def test_the_ablation_tables_of_the_tuning_doc_are_written_from_their_csvs(tmp_path):
    """docs/tuning.md's transformer ablation: one table per budget, each row's settings where they differ from the
    first row's (a later value of a setting wins), its margin against the first row."""
    path = tmp_path / "transformer_ablation.csv"
    path.write_text("row,settings,valid_bpb,test_bpb,test_word_ppl,train_seconds\n"
                    "base,budget={flops: 2e+13} arch.mlp=gelu optim.name=adamw,2.30,2.08,9000,600\n"
                    "+ muon,budget={flops: 2e+13} arch.mlp=gelu optim.name=adamw optim.name=muon,2.20,1.99,6000,650\n")
    lines = tuning_doc.ablation_markdown([path])
    assert "### 2.0e+13 training FLOPs" in lines[8]
    assert ["base", "(none)", "2.3000", "+0.0000", "2.0800", "600"] in table_rows(lines)
    assert ["+ muon", "`optim.name=muon`", "2.2000", "-0.1000", "1.9900", "650"] in table_rows(lines)
    assert tuning_doc.ablation_markdown([]) == []


def test_the_tuning_effort_table_counts_each_familys_runs_flops_and_settings_and_says_when_they_differ(tmp_path):
    """docs/tuning.md's effort table: every trial and ablation row of a family (pruned ones too; a winner's seed
    reruns not), their FLOPs and the settings varied, most runs first; unequal effort is said, with its range."""
    def sweep(folder: str, header: str, *rows: str) -> Path:
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "trials.csv").write_text("\n".join([header, *rows]) + "\n")
        (tmp_path / folder / "seeds.csv").write_text("seed,valid_bpb\n1,2.5\n2,2.6\n")
        return tmp_path / folder

    header = "number,state,valid_bpb,optim.lr,evaluations,tokens_seen,train_flops,seconds"
    gru = sweep("equal/gru", header, "0,COMPLETE,2.2,0.002,7,1,3e13,1", "1,PRUNED,2.3,0.004,2,1,1e13,1")
    nplm = sweep("nplm", "number,state,valid_bpb,arch.emb,batch_size,train_flops", "0,COMPLETE,2.7,64,32,1.2e13")
    ablation = tmp_path / "transformer_ablation.csv"
    ablation.write_text("row,settings,valid_bpb,test_bpb,test_word_ppl,train_seconds\n"
                        "base,budget={flops: 2e+13} arch.mlp=gelu optim.name=adamw,2.30,2.08,9000,600\n"
                        "+ muon,budget={flops: 2e+13} arch.mlp=gelu optim.name=muon,2.20,1.99,6000,650\n")
    lines = tuning_doc.effort_markdown(tuning_doc.effort([(gru, tmp_path / "equal.yaml"), (nplm, tmp_path / "space.yaml")],
                                                          [ablation]))
    rows = table_rows(lines)[1:]  # the header aside
    assert [r[:3] for r in rows] == [["gru", "2", "4.00e+13"], ["transformer", "2", "4.00e+13"], ["nplm", "1", "1.20e+13"]]
    assert rows[0][3] == "`optim.lr`" and rows[1][3] == "`arch.mlp`, `optim.name`"
    assert rows[2][3] == "`arch.emb`, `batch_size`" and rows[2][4].endswith("nplm (1)")
    assert "not equal: from 1 to 2 runs" in lines[2]
    even = tuning_doc.effort_markdown(tuning_doc.effort([(gru, tmp_path / "equal.yaml")], []))
    assert "The effort is equal." in even[2]
    assert tuning_doc.effort_markdown(tuning_doc.effort([], [])) == []
