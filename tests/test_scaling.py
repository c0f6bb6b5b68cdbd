"""Scaling-law fits: they recover a law they are given, find IsoFLOP minima, and the grid is what params say."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import minimize_scalar

from lmpipe.config import parse_params
from lmpipe.errors import ConfigError
from lmpipe.flops import peak_flops
from tests.helpers import entry, project_params, synthetic_data, table_rows
from lmpipe.scaling import (Law, analyse, best_per_budget, fit_law, grid_points, isoflop_minimum, mean_over_seeds,
                            power_law, seed_spread)

TRUE = Law(E=1.7, A=40.0, alpha=0.35, B=300.0, beta=0.4)


def synthetic_runs(law: Law, noise: float, seed: int = 0, sizes=np.geomspace(1e5, 3e7, 5),
                   budgets=np.geomspace(1e12, 1e15, 4)) -> list[dict]:
    """Runs of a grid whose losses come from `law` with lognormal noise, as the grid stage writes them."""
    rng = np.random.default_rng(seed)
    rows = []
    for c in budgets:
        for n in sizes:
            d = c / (6 * n)
            rows.append({"name": f"n{n:.0f}-c{c:.0e}", "model": "m", "size": f"{n:.0f}", "budget": c, "n_params": n,
                         "tokens": d, "valid_bpb": float(law.loss(n, d) * math.exp(rng.normal(0, noise)))})
    return rows


def test_fit_recovers_the_constants_of_a_known_law_from_noisy_points():
    rows = synthetic_runs(TRUE, noise=0.003)
    law = fit_law(*(np.array([r[k] for r in rows]) for k in ("n_params", "tokens", "valid_bpb")))
    assert law.alpha == pytest.approx(TRUE.alpha, abs=0.03)
    assert law.beta == pytest.approx(TRUE.beta, abs=0.03)
    assert law.E == pytest.approx(TRUE.E, rel=0.03)
    assert law.optimal_loss(1e16) == pytest.approx(TRUE.optimal_loss(1e16), rel=0.01)  # 10x beyond the grid
    assert law.optimal_n(1e16) == pytest.approx(TRUE.optimal_n(1e16), rel=0.15)


def test_compute_optimal_size_in_closed_form_minimises_the_law_at_fixed_compute():
    for c in (1e13, 1e17):
        numeric = minimize_scalar(lambda x: TRUE.loss(math.exp(x), c / (6 * math.exp(x))), bounds=(5, 30),
                                  method="bounded", options={"xatol": 1e-9})
        assert TRUE.optimal_n(c) == pytest.approx(math.exp(numeric.x), rel=1e-4)
    exps = TRUE.exponents()
    assert exps["a"] + exps["b"] == pytest.approx(1)
    assert exps["a"] == pytest.approx(0.4 / 0.75)


def test_a_fit_with_an_exponent_at_its_bound_predicts_the_infimum_instead_of_dividing_by_zero():
    """A bootstrap refit can end at alpha = 0 (the loss flat in N): all compute goes to data, N_opt -> 0, and
    the loss tends to E + A (the real CPU grid's bootstrap hit this and the fit stage crashed)."""
    flat_in_n = Law(E=1.0, A=0.5, alpha=0.0, B=400.0, beta=0.3)
    assert flat_in_n.optimal_n(1e15) == 0.0 and flat_in_n.optimal_loss(1e15) == 1.5
    assert flat_in_n.loss(1e-9, 1e15 / 6e-9) == pytest.approx(1.5, abs=1e-3)  # the limit it stands for
    flat_in_d = Law(E=1.0, A=0.5, alpha=0.3, B=400.0, beta=0.0)
    assert flat_in_d.optimal_n(1e15) == math.inf and flat_in_d.optimal_loss(1e15) == 401.0
    assert flat_in_d.exponents() == {"a": 0.0, "b": 1.0}
    assert all(math.isnan(v) for v in Law(E=1.0, A=0.5, alpha=0.0, B=1.0, beta=0.0).exponents().values())


def test_isoflop_minimum_is_the_parabola_vertex_or_the_edge_of_the_grid():
    n = np.geomspace(1e5, 1e6, 5)
    inside = isoflop_minimum(n, 2.0 + 0.1 * (np.log(n) - math.log(3e5)) ** 2)
    assert inside["bracketed"] and inside["n_opt"] == pytest.approx(3e5, rel=1e-6)
    assert inside["loss_opt"] == pytest.approx(2.0)
    falling = isoflop_minimum(n, 3.0 - 0.1 * np.log(n))  # bigger is always better here: the optimum is off the grid
    assert not falling["bracketed"] and falling["n_opt"] == pytest.approx(1e6) and falling["edge"] == "largest"



def test_isoflop_minimum_is_local_to_the_best_run_so_a_far_run_cannot_unbracket_it():
    # The RNN's C/32 profile in the grid: best at emb16, a run on each side, and emb256 0.27 bpb above it. A parabola
    # through all six runs puts its vertex below the smallest size; the best run's own neighbours bracket it.
    n = [73872, 139808, 272448, 540800, 1089792, 2236928]
    loss = [2.779852, 2.768510, 2.803372, 2.884014, 2.993370, 3.041806]
    c2, c1, _ = np.polyfit(np.log(n), loss, 2)
    assert not math.log(n[0]) <= -c1 / (2 * c2) <= math.log(n[-1])  # what the global parabola did
    shuffled = [5, 1, 3, 0, 4, 2]
    minimum = isoflop_minimum([n[i] for i in shuffled], [loss[i] for i in shuffled])
    assert minimum["bracketed"] and minimum["span"] == [73872.0, 272448.0]
    assert 73872 < minimum["n_opt"] < 272448 and minimum["loss_opt"] <= 2.768510
    assert np.polyval(minimum["coefficients"], math.log(139808)) == pytest.approx(2.768510)
    at_edge = isoflop_minimum(n[1:], loss[1:])  # without emb8 the best run is the smallest: not bracketed
    assert not at_edge["bracketed"] and at_edge["edge"] == "smallest" and at_edge["n_opt"] == 139808

def test_isoflop_exponents_of_a_known_law_match_its_closed_form():
    rows = synthetic_runs(TRUE, noise=0.0, sizes=np.geomspace(1e4, 1e9, 21), budgets=np.geomspace(1e14, 1e17, 4))
    analysis = analyse(rows, bootstrap=0)["m"]
    assert all(p["bracketed"] for p in analysis["isoflop"])
    assert analysis["isoflop_exponents"]["n_opt"]["exponent"] == pytest.approx(TRUE.exponents()["a"], abs=0.03)
    assert analysis["isoflop_exponents"]["d_opt"]["exponent"] == pytest.approx(TRUE.exponents()["b"], abs=0.03)


def seeded_runs(law: Law, noise: float, seeds: int = 3, bend: float = 0.0, **grid) -> list[dict]:
    """`synthetic_runs` with `seeds` runs a point, as `mean_over_seeds` gives them to the fits; `bend` adds a wave in
    log N that no law of the form can follow."""
    runs = [{**r, "name": r["name"] + (f"-seed{s}" if s else ""),
             "valid_bpb": r["valid_bpb"] + bend * math.sin(2 * math.log(r["n_params"]))}
            for s in range(seeds) for r in synthetic_runs(law, noise, seed=s, **grid)]
    return mean_over_seeds(runs)


def test_analysis_predicts_held_out_runs_and_its_intervals_over_the_seeds_cover_the_truth():
    analysis = analyse(seeded_runs(TRUE, noise=0.003), bootstrap=30, seed=1)["m"]
    held = analysis["holdout"]
    assert held["budget"] == pytest.approx(1e15) and len(held["runs"]) == 5  # the largest budget's runs
    assert held["mean_abs_relative_error"] < 0.02
    assert not analysis["law_fit"]["rejected"] and analysis["law_fit"]["df_pure"] == 40  # 20 points, 3 seeds each
    lo, hi = analysis["law_intervals"]["alpha"]
    assert lo <= TRUE.alpha <= hi and hi - lo < 0.2
    low, high = analysis["predictions"]["100x"]["interval"]
    assert low <= TRUE.optimal_loss(1e17) <= high


def test_a_law_its_replicates_reject_gives_no_interval_and_no_extrapolation():
    analysis = analyse(seeded_runs(TRUE, noise=0.003, bend=0.03), bootstrap=30, seed=1)["m"]
    assert analysis["law_fit"]["rejected"] and analysis["law_fit"]["p"] < 0.05
    assert analysis["law_intervals"] == {} and analysis["predictions"] == {}
    assert analysis["law_exponent_intervals"] == {}


def test_n_opt_exponent_spans_its_fitting_methods_and_the_seeds_bootstrap():
    from lmpipe.scaling import n_opt_methods

    rows = seeded_runs(TRUE, noise=0.002, sizes=np.geomspace(1e4, 1e9, 21), budgets=np.geomspace(1e14, 1e17, 4))
    found = n_opt_methods(rows, samples=40, seed=2)
    values = [m["exponent"] for m in found["methods"].values()]
    assert set(found["methods"]) == {"vertex", "one_seed", "best_size"}
    lo, hi = found["interval"]
    assert lo <= min(values) and max(values) <= hi and lo <= TRUE.exponents()["a"] <= hi
    assert all(0 <= share <= 1 for share in found["bracketed_share"].values())
    assert n_opt_methods(rows, samples=40, seed=2) == found  # the same seed, the same interval
    assert n_opt_methods(rows, samples=0, seed=2)["interval"] is None  # no draws: no interval


def test_families_fitted_side_by_side_give_the_numbers_of_one_after_the_other():
    rows = [{**r, "model": model} for model, law in (("a", TRUE), ("b", Law(E=1.9, A=30.0, alpha=0.3, B=200.0, beta=0.35)))
            for r in synthetic_runs(law, noise=0.003)]
    assert analyse(rows, bootstrap=2, workers=2, coarse=True) == analyse(rows, bootstrap=2, workers=1, coarse=True)


def test_power_law_fit_recovers_an_exponent_and_its_interval_covers_it_as_often_as_it_says():
    fit = power_law([1, 10, 100], [3, 3 * 10 ** 0.5, 3 * 100 ** 0.5])
    assert fit["exponent"] == pytest.approx(0.5) and fit["coefficient"] == pytest.approx(3)
    assert fit["interval"] == pytest.approx([0.5, 0.5]) and fit["scatter"] == pytest.approx(0, abs=1e-12)
    assert set(power_law([1, 10], [1, 2])) == {"exponent", "coefficient"}  # two points: a line, no interval
    rng, budgets = np.random.default_rng(0), np.geomspace(4.7e11, 7.5e12, 5)
    fits = [power_law(budgets, 2 * budgets ** 0.6 * np.exp(rng.normal(0, 0.15, 5))) for _ in range(400)]
    covered = np.mean([lo <= 0.6 <= hi for lo, hi in (f["interval"] for f in fits)])
    assert 0.86 <= covered <= 0.94  # a 90% interval holds the true exponent nine times in ten
    # the scatter's mean on 3 degrees of freedom: c4 sigma, c4 = 0.92
    assert np.mean([f["scatter"] for f in fits]) == pytest.approx(0.15 * 0.92, rel=0.1)


def test_best_per_budget_picks_the_lowest_loss_across_families():
    rows = [{"model": "a", "size": "s", "budget": 1.0, "n_params": 1, "tokens": 1, "valid_bpb": 2.0},
            {"model": "b", "size": "t", "budget": 1.0, "n_params": 2, "tokens": 1, "valid_bpb": 1.5},
            {"model": "a", "size": "s", "budget": 2.0, "n_params": 1, "tokens": 2, "valid_bpb": 1.2}]
    assert [(b["budget"], b["model"]) for b in best_per_budget(rows)] == [(1.0, "b"), (2.0, "a")]


def test_grid_is_every_size_at_every_budget_smallest_budget_first():
    points = grid_points({"transformer": [{"dim": 32}, {"dim": 64}], "lstm": [{"hidden": 32}]}, [2e12, 1e12])
    assert len(points) == 6 and len({p.name for p in points}) == 6
    assert [p.budget for p in points] == [1e12] * 3 + [2e12] * 3
    assert points[0].name == "transformer-dim32-C1.0e+12"


def test_extra_seeds_run_every_size_at_their_budgets_and_a_point_is_its_runs_mean():
    points = grid_points({"lstm": [{"hidden": 8}, {"hidden": 16}]}, [2e12, 1e12], extra_seeds=[1, 2],
                         seeded_budgets=[1e12])
    assert [(p.size["hidden"], p.budget, p.seed) for p in points] == [
        (8, 1e12, None), (8, 1e12, 1), (8, 1e12, 2), (16, 1e12, None), (16, 1e12, 1), (16, 1e12, 2),
        (8, 2e12, None), (16, 2e12, None)]
    assert points[1].name == "lstm-hidden8-C1.0e+12-seed1"
    rows = [{"name": p.name, "model": p.model, "size": f"hidden{p.size['hidden']}", "budget": str(p.budget),
             "valid_bpb": str(2.5 + 0.01 * (p.seed or 0))} for p in points]
    means = mean_over_seeds(rows)
    assert [(r["name"], r["seeds"]) for r in means] == [("lstm-hidden8-C1.0e+12", 3), ("lstm-hidden16-C1.0e+12", 3),
                                                          ("lstm-hidden8-C2.0e+12", 1), ("lstm-hidden16-C2.0e+12", 1)]
    assert means[0]["valid_bpb"] == pytest.approx(2.51) and means[0]["seed_sd"] == pytest.approx(0.01)
    assert means[2]["valid_bpb"] == "2.5" and means[2]["seed_sd"] is None  # one run: its row as it was
    assert seed_spread(means) == [{"budget": 1e12, "seeds": 3, "points": 2, "sd": pytest.approx(0.01)}]
    with pytest.raises(ConfigError, match=r"scaling: seeds.budgets 3e\+12: not in budgets \(name budgets of"):
        parse_params(project_params(scaling={"models": {}, "budgets": [1e12], "seeds": {"extra": [1], "budgets": [3e12]}}))


def test_around_best_budgets_train_only_their_listed_sizes_in_budget_order_with_their_seeds():
    from flows.scaling import plan
    from lmpipe.grid_record import grid_settings

    sizes = {"lstm": [{"emb": 8, "hidden": 8}, {"emb": 16, "hidden": 16}], "gru": [{"emb": 8}]}
    around = [{"budget": 4e8, "models": {"lstm": [{"emb": 16, "hidden": 16}, {"emb": 32, "hidden": 32}]}},
              {"budget": 3e8, "models": {"gru": [{"emb": 16}]}}]
    # budgets to fit the synthetic data's few tokens (lmpipe.scaling.MAX_EPOCHS)
    params = parse_params(project_params(scaling={"models": sizes, "budgets": [1e8], "around_best": around,
                                                  "seeds": {"extra": [1], "budgets": [4e8]}}))
    points, jobs = plan(params, synthetic_data())
    assert [p.name for p in points] == [
        "lstm-emb8-hidden8-C1.0e+08", "lstm-emb16-hidden16-C1.0e+08", "gru-emb8-C1.0e+08", "gru-emb16-C3.0e+08",
        "lstm-emb16-hidden16-C4.0e+08", "lstm-emb16-hidden16-C4.0e+08-seed1",
        "lstm-emb32-hidden32-C4.0e+08", "lstm-emb32-hidden32-C4.0e+08-seed1"]
    assert jobs[-1].settings.arch["hidden"] == 32 and jobs[-1].settings.budget.flops == 4e8
    assert params.scaling.all_sizes()["lstm"][-1] == {"emb": 32, "hidden": 32}
    # a grid made before around_best existed keeps its record (and its MLflow run) while the list is empty
    empty = parse_params(project_params(scaling={"models": sizes, "budgets": [1e8]}))
    assert "around_best" not in grid_settings(empty) and grid_settings(params)["around_best"][0]["budget"] == 4e8
    for bad, message in (([{"budget": 1e8, "models": {}}], r"around_best budget 1e\+08: already a budget of the grid"),
                         ([{"budget": 2e8, "models": {"rnn": [{"emb": 8}]}}], "around_best names rnn, not a family")):
        with pytest.raises(ConfigError, match=message):
            parse_params(project_params(scaling={"models": sizes, "budgets": [1e8], "around_best": bad}))


def test_each_grid_point_trains_its_size_to_its_flop_budget():
    import torch

    from flows.scaling import precision_key, prepare_point

    params = parse_params(project_params(
        study={"budget": {"flops": 3e13}}, models={"lstm": entry("rnn", {"cell": "lstm", "emb": 256, "hidden": 256})},
        scaling={"models": {"lstm": [{"emb": 32, "hidden": 32}]}, "budgets": [1e12],
                 "overrides": {"batch_size": 16, "optim.warmup_steps": 5}}))
    point = grid_points(params.scaling.models, params.scaling.budgets)[0]
    job = prepare_point(point, params, synthetic_data())
    settings, common = job.settings, job.common
    assert settings.arch == {"cell": "lstm", "emb": 32, "hidden": 32} and settings.batch_size == 16
    assert common.evals_per_epoch == params.scaling.evals_per_epoch and common.seed == params.train.seed
    assert settings.optim.warmup_steps == 5 and settings.budget.flops == 1e12
    job.trainer.autocast = None  # the run in fp32 (what `precision: auto` gives without native bf16)
    assert job.key(**precision_key(job)) == job.key()  # the key of its checkpoint folder too
    job.trainer.autocast = torch.bfloat16  # the same run where the CPU multiplies bf16: another row
    assert job.key(**precision_key(job)) != job.key()
    bad = parse_params(project_params(models={"lstm": entry("rnn", epochs=1)},
                                      scaling={"models": {"lstm": [{"dim": 32}]}, "budgets": [1e12]}))
    with pytest.raises(ConfigError, match=r"scaling, lstm-dim32-C1.0e\+12: settings .*: arch has \[.dim.\]"):
        prepare_point(grid_points(bad.scaling.models, bad.scaling.budgets)[0], bad, synthetic_data())


def test_a_grid_point_with_a_seed_of_its_own_is_another_run_under_another_name():
    from dataclasses import replace

    from flows.scaling import prepare_point, row_key

    params = parse_params(project_params(scaling={"models": {"lstm": [{"emb": 32, "hidden": 32}]}, "budgets": [1e12]}))
    point = grid_points(params.scaling.models, params.scaling.budgets)[0]
    again = replace(point, seed=params.train.seed + 1)
    first, second = (prepare_point(p, params, synthetic_data()) for p in (point, again))
    assert second.common.seed == params.train.seed + 1 and first.common.seed == params.train.seed
    assert second.settings == first.settings and row_key(second) != row_key(first)
    assert again.name == point.name + f"-seed{params.train.seed + 1}"


def test_the_grid_leaves_out_a_run_that_would_read_the_corpus_more_than_max_epochs_times(capsys):
    from flows.scaling import plan, planned_epochs
    from lmpipe.scaling import MAX_EPOCHS

    data = synthetic_data()
    epoch_tokens = len(data.splits["train"].tokens)
    params = parse_params(project_params(
        models={"gru": entry("rnn", {"cell": "gru", "emb": 64, "hidden": 64}, epochs=1)},
        scaling={"models": {"gru": [{"emb": 8, "hidden": 8}, {"emb": 32, "hidden": 32}]}, "budgets": [1.0],
                 "overrides": {"batch_size": 4, "seq_len": 16}}))
    small = parse_params({**params.model_dump(mode="json"), "scaling": {**params.section("scaling"), "budgets": [2e7]}})
    points, jobs = plan(small, data)
    assert len(points) == 2
    per_epoch = {p.size["emb"]: p.budget / planned_epochs(j.settings, p.budget, data.vocab_size, epoch_tokens)
                 for p, j in zip(points, jobs)}  # FLOPs of one pass over the training tokens, per size
    for p, j in zip(points, jobs):  # counted as the trainer counts: the tokens its budget buys
        assert per_epoch[p.size["emb"]] == pytest.approx(j.trainer.flops_per_token * epoch_tokens, rel=1e-12)
    budget = MAX_EPOCHS * (per_epoch[8] + per_epoch[32]) / 2  # over the cap for the small size, under it for the other
    capsys.readouterr()
    points, _ = plan(parse_params({**small.model_dump(mode="json"),
                                   "scaling": {**small.section("scaling"), "budgets": [budget]}}), data)
    assert [p.size for p in points] == [{"emb": 32, "hidden": 32}]
    assert f"gru-emb8-hidden8-C{budget:.1e}: left out, it would read the training tokens" in capsys.readouterr().out


def test_scaling_must_name_models_of_the_study_and_positive_budgets():
    with pytest.raises(ConfigError, match="scaling.models names \\['gpt'\\]"):
        parse_params(project_params(models={"lstm": entry("rnn", epochs=1)}, scaling={"models": {"gpt": [{}]}}))
    with pytest.raises(ConfigError, match="budgets must be positive"):
        parse_params(project_params(scaling={"budgets": [0]}))


def test_peak_flops_table_knows_the_lent_gpus_and_nothing_else():
    assert peak_flops("NVIDIA H100 80GB HBM3") == 989e12  # SXM
    assert peak_flops("NVIDIA H100 PCIe") == 756e12
    assert peak_flops("NVIDIA H200") == 989e12
    assert peak_flops("NVIDIA A100-SXM4-80GB") == 312e12
    assert peak_flops("cpu") is None and peak_flops("Tesla T4") is None


def test_the_grid_depends_on_the_models_it_trains_not_on_the_whole_study():
    """scaling/dvc.yaml names models.<family> for each family of scaling.models; a family it does not name is
    refused in one line (DVC would not re-run the grid when its settings change)."""
    import pytest
    import yaml

    from flows._stage import check_declared
    from lmpipe.errors import ConfigError
    from tests.helpers import ROOT

    families = list(yaml.safe_load((ROOT / "params.yaml").read_text())["scaling"]["models"])
    declared = yaml.safe_load((ROOT / "scaling/dvc.yaml").read_text())["stages"]["grid"]["params"]
    assert "models" not in declared
    check_declared(families, "scaling/dvc.yaml", "grid")
    with pytest.raises(ConfigError, match="scaling.models lists my_lm, but scaling/dvc.yaml's grid does not "
                                          "name models.my_lm in its params"):
        check_declared(families + ["my_lm"], "scaling/dvc.yaml", "grid")  # a model of the user's


def test_the_grid_is_stale_exactly_where_its_data_or_settings_changed():
    """made_with records what the grid trained from; changed_since names what differs now, as a user would."""
    from lmpipe.config import load_params
    from lmpipe.grid_record import changed_since, made_with
    from lmpipe.splits import Split, TokenData
    from tests.helpers import ROOT

    params = load_params(ROOT / "params.yaml")
    data = TokenData(8, 0, {s: Split(s, np.arange(5, dtype=np.uint16), 3, 9) for s in ("train", "valid", "test")})
    recorded = made_with(params, data)
    assert changed_since(recorded, made_with(params, data)) == []
    other = TokenData(8, 0, {**data.splits, "test": Split("test", np.arange(6, dtype=np.uint16), 3, 9)})
    changed = params.model_copy(update={"models": {**params.models, "lstm": params.models["lstm"].model_copy(
        update={"batch_size": 7})}})
    assert changed_since(recorded, made_with(changed, other)) == ["data/tokens", "models.lstm"]
    assert changed_since(None, recorded) == ["the grid's record (scaling/made_with.json is missing)"]


def test_a_grid_with_extra_seeds_reports_its_runs_points_and_each_seeded_budgets_spread(tmp_path):
    """A point with several seeds is fitted as their mean: the report counts runs and points, gives each seeded
    budget's seed sd of a run and of a mean, and its sentences and caveats say which points are means."""
    from lmpipe.scaling_report import scaling_markdown, seeds_phrase

    runs = [{**r, "model": "lstm", "name": f"lstm-{r['name']}", "flops": r["budget"], "device": "cpu",
             "epoch_tokens": 600_000} for r in synthetic_runs(TRUE, 0.0, budgets=np.geomspace(1e12, 1e14, 3))]
    seeded = [r for r in runs if r["budget"] == 1e12]
    runs += [{**r, "name": f"{r['name']}-seed{s}", "valid_bpb": r["valid_bpb"] + d}
             for r in seeded for s, d in ((1, 0.02), (2, -0.02))]
    points = mean_over_seeds(runs)
    assert len(points) == 15 and [p["valid_bpb"] for p in points[:5]] == pytest.approx([r["valid_bpb"] for r in seeded])
    meta = {"sizes": (5, 5), "budgets": 3, "min_budget": 1e12, "max_budget": 1e14, "train_tokens": 600_000,
            "flops": sum(r["flops"] for r in runs), "device": "cpu", "bootstrap": 0, "huber_delta": 1e-3,
            "runs": len(runs), "seed_spread": seed_spread(points)}
    text = scaling_markdown(points, analyse(points, bootstrap=0, coarse=True), best_per_budget(points), None, meta)
    assert text.split("\n")[2].startswith("25 runs, 15 points: 5 sizes of each of lstm at each of 3 compute budgets")
    assert "At 1 budget every size ran with several seeds, and a point is their mean (the Seeds section)." in text
    assert ["1.0e+12", "3", "5", "0.0200", "0.0115"] in table_rows(text)  # sd 0.02 a run, 0.02 / sqrt(3) a mean
    assert seeds_phrase(meta["seed_spread"]) == "the mean of 3 seeds a point at 1 budget and one seed at the others"
    assert "At 1.0e+12 FLOPs a point is the mean of 3 runs with different seeds (the Seeds table)" in text
    one_seed = scaling_markdown(points[5:], analyse(points[5:], bootstrap=0, coarse=True), best_per_budget(points[5:]),
                                None, {**meta, "runs": 10, "seed_spread": []})
    assert "## Seeds" not in one_seed and "Each point is one training run with one seed" in one_seed


def test_the_report_of_a_five_family_grid_draws_each_family_and_says_where_each_minimum_lies(tmp_path):
    """Five families (the grid's size): the report names each, its figures lay the families out in
    rows of at most three, and a family whose best run is its smallest size is said to lie below the sizes tried."""
    from matplotlib.image import imread

    from lmpipe.scaling_report import write_scaling_report

    rows = []
    for k, model in enumerate(("transformer", "lstm", "gru", "rnn", "nplm")):
        law = Law(E=1.7 + 0.05 * k, A=40.0, alpha=0.35, B=300.0, beta=0.4)
        sizes = np.geomspace(1e7, 1e8, 4) if model == "nplm" else np.geomspace(1e5, 3e7, 4)  # nplm: all too big
        rows += [{**r, "model": model, "name": f"{model}-{r['name']}", "flops": r["budget"], "device": "cpu",
                  "epoch_tokens": 600_000} for r in synthetic_runs(law, 0.0, sizes=sizes,
                                                                   budgets=np.geomspace(1e12, 1e14, 3))]
    analysis = analyse(rows, bootstrap=0, coarse=True)  # the report, not the fit, is tested
    meta = {"sizes": (4, 4), "budgets": 3, "min_budget": 1e12, "max_budget": 1e14, "train_tokens": 600_000,
            "flops": sum(r["budget"] for r in rows), "device": "cpu", "bootstrap": 0, "huber_delta": 1e-3,
            "stale": []}
    text = write_scaling_report(rows, analysis, best_per_budget(rows), ("KN-5", 2.3), meta, tmp_path).read_text()
    for model in ("transformer", "lstm", "gru", "rnn", "nplm"):
        assert f"- {model}: the IsoFLOP minimum lies" in text
    assert "- nplm: the IsoFLOP minimum lies at no budget inside the sizes tried: the best run is always the " \
           "smallest size, so N_opt lies below the smallest size tried" in text
    isoflop = [row for row in table_rows(text) if len(row) == 7 and row[6] in ("yes", "no")]  # model, C, N_opt,
    # D_opt, epochs, bpb at N_opt, bracketed
    assert [row[6] for row in isoflop if row[0] == "nplm"] == ["no"] * 3
    assert len(isoflop) == 15 and all(float(row[4]) == pytest.approx(float(row[3].replace(",", "")) / 600_000, abs=0.005)
                                      for row in isoflop)  # D_opt in reads of the 600,000 training tokens
    assert [row[1] for row in isoflop if row[0] == "transformer"] == ["1.0e+12", "1.0e+13", "1.0e+14"]
    from lmpipe.scaling_report import precision_sentence

    budgets = [1e12, 2e12, 4e12]

    def line(lo, hi, scatter=0.1):
        return {"exponent": (lo + hi) / 2, "coefficient": 1.0, "interval": [lo, hi], "scatter": scatter}

    assert precision_sentence(line(0.40, 0.54), 3, budgets) == (
        "Its exponent is known to +-0.070 (target +-0.1): met, from one seed a run (see 'How far to trust this').")
    assert precision_sentence(line(0.40, 0.54), 3, budgets, "the mean of 3 seeds a point at 3 budgets").endswith(
        "met, from the mean of 3 seeds a point at 3 budgets (see 'How far to trust this').")
    assert precision_sentence(line(0.4952, 0.6987), 3, budgets).startswith(  # not "+-0.10 ...: missed"
        "Its exponent's interval is +-0.102 (target +-0.1): missed")
    assert precision_sentence(line(0.2, 0.7), 1, budgets).endswith(
        "missed, as only 1 of its 3 IsoFLOP minima lie inside the sizes tried, so the runs pin the optimum's move poorly.")
    assert precision_sentence(line(0.2, 0.7), 3, budgets).endswith(
        "missed, as its minima scatter about the line by 11% in N (one seed a run; a size keeps its seed's luck at "
        "every budget, and the profile is flat near its minimum).")
    # minima that stand still over the smaller budgets, then grow as C^0.8: the bend is the reason given
    from lmpipe.scaling import power_law

    bent = [{"budget": 2.0 ** k, "n_opt": 1e5 * 2.0 ** (0.8 * max(k - 3, 0)) * (1.02 if k % 2 else 1)}
            for k in range(7)]
    line_bent = power_law([p["budget"] for p in bent], [p["n_opt"] for p in bent])
    assert precision_sentence(line_bent, 7, [p["budget"] for p in bent], minima=bent).endswith(
        "they move as N_opt ~ C^0.00 over the 3 smallest budgets and C^0.79 over the 4 largest (90% intervals -0.10 "
        "to 0.10 and 0.77 to 0.82, apart), so the optimum does not move as one power of C over these budgets, and a "
        "line through them all leaves a wide interval.")
    straight = [{"budget": p["budget"], "n_opt": 1e5 * p["budget"] ** 0.5 * (1.6 if i % 2 else 1)}
                for i, p in enumerate(bent)]  # scattered about one line: the old reason
    line_straight = power_law([p["budget"] for p in straight], [p["n_opt"] for p in straight])
    assert precision_sentence(line_straight, 7, [p["budget"] for p in straight], minima=straight).endswith(
        "a size keeps its seed's luck at every budget, and the profile is flat near its minimum).")
    assert precision_sentence({"exponent": 0.5, "coefficient": 1.0}, 2, budgets) == (
        "With 2 of its 3 IsoFLOP minima inside the sizes tried, its exponent has no interval (target +-0.1): missed.")
    # the law's interval narrow around another value than the minima's (the NPLM's law pinned at E = 0): said so
    from lmpipe.scaling_report import law_sentence

    family = {"law_exponents": {"a": 0.10}, "law_exponent_intervals": {"a": [0.07, 0.17]},
              "isoflop_exponents": {"n_opt": line(0.2, 0.64)}, "holdout": {"mean_abs_relative_error": 0.011}}
    assert law_sentence(family) == (
        "The fitted law puts N_opt ~ C^0.10 (90% interval 0.07 to 0.17), which does not hold the minima's exponent: "
        "the law does not describe these runs well enough to measure it; fitted without the largest budget, it "
        "predicts those runs to within 1.1% on average.")
    for figure in ("isoflop.png", "law.png"):
        height, width = imread(tmp_path / "scaling" / figure).shape[:2]
        # two panels a row, five families in three rows: no wider than the page shows a figure at its own size
        assert width == round(2 * 4.3 * 110) <= 960 and height > round(3 * 3.6 * 110) - 2, (figure, width, height)


def test_a_minimum_far_below_its_runs_is_named_in_the_caveats():
    """Three runs with a close neighbour on one side and a far one on the other (a size added between): the
    parabola's vertex lies 0.03 bpb below every run, which the caveats name with the family and budget; evenly
    spaced neighbours give a vertex near the best run, which they leave out."""
    from lmpipe.scaling_report import caveats, vertex_dips

    rows = [{"model": "transformer", "budget": 1e13, "size": f"n{n:g}", "n_params": n, "valid_bpb": bpb}
            for n, bpb in ((0.45e6, 2.3084), (0.62e6, 2.2455), (1.6e6, 2.2560))]
    rows += [{"model": "gru", "budget": 1e13, "size": f"n{n:g}", "n_params": n, "valid_bpb": bpb}
             for n, bpb in ((0.3e6, 2.31), (0.6e6, 2.25), (1.2e6, 2.26))]
    analysis = {m: {"isoflop": [{"budget": 1e13, **isoflop_minimum([r["n_params"] for r in rows if r["model"] == m],
                                                                   [r["valid_bpb"] for r in rows if r["model"] == m])}]}
                for m in ("gru", "transformer")}
    dips = vertex_dips(rows, analysis)
    assert [(m, round(d, 3)) for d, m, _ in dips] == [("transformer", 0.032), ("gru", 0.004)]
    assert ("and 1 of 2 lie more than 0.01 bpb below their budget's best run: transformer at 1.0e+13 (0.032). There "
            "the best run's neighbours sit at unequal distances in size") in caveats([], dips)
    assert "lie more than" not in caveats([], dips[1:])


def test_a_rejected_or_degenerate_law_is_said_to_be_so_and_its_exponent_not_read_as_a_measurement():
    from lmpipe.scaling_report import law_sentence, law_usable

    family = {"law_exponents": {"a": 0.57}, "law_exponent_intervals": {}, "isoflop_exponents": None,
              "holdout": {"mean_abs_relative_error": 0.008},
              "law_fit": {"f": 17.4, "p": 1.2e-16, "df_lack": 49, "df_pure": 42, "rejected": True},
              "law_degenerate": False}
    assert not law_usable(family)
    assert law_sentence(family) == (
        "The fitted law L(N, D) is rejected (lack-of-fit F = 17.40 on 49 and 42 df, p = 1.2e-16), so its N_opt ~ "
        "C^0.57 is not a measurement and it is used for no interval or prediction.")
    degenerate = {**family, "law_fit": {**family["law_fit"], "p": 0.3, "rejected": False}, "law_degenerate": True}
    assert not law_usable(degenerate) and "not rejected (lack-of-fit F = 17.40 on 49 and 42 df, p = 0.3); degenerate" \
        in law_sentence(degenerate)
