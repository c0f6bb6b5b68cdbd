"""The report's "As compute grows": the grid's frontier ranked at each budget by the gap rule, curves tested for
lack of fit against the seeds, crossings only where the measured order flips inside the budgets, and the study's
models stopped early shown as a learning curve, with no curve fitted to them."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from lmpipe import seeds
from lmpipe.as_compute_grows import against_grid, crossing_lines, ranking, section
from lmpipe.compute_curves import (Curve, annealed, crossing, crossings, fit_curve, fit_family, frontier_points,
                                   grid_fits, measured_flips)
from lmpipe.scaling import frontier
from lmpipe.report import build_report
from lmpipe.report_figures import compute_figure
from tests.helpers import fixture_study, table_rows, write

C = 3e13
BUDGETS = [C / 16, C / 8, C / 4, C / 2, C]
NOISE = np.array([0.002, -0.001, 0.0015, -0.002, 0.001])  # fixed, so the fits are exact to test against


def law(e, a, alpha):
    return [e + a * (b / C) ** -alpha + n for b, n in zip(BUDGETS, NOISE)]


# the transformer falls faster: behind the LSTM at C/16, ahead at C (they cross between C/2 and C)
TRUTH = {"transformer": (1.6, 0.35, 0.5), "lstm": (1.85, 0.12, 0.3), "gru": (1.87, 0.12, 0.3)}


def points() -> dict:
    return {name: [{"budget_flops": b, "train_flops": b * 1.0002, "tokens_seen": 1, "valid_bpb": y + 0.2,
                    "test_bpb": y} for b, y in zip(BUDGETS, law(*truth))] for name, truth in TRUTH.items()}


def test_the_fit_recovers_each_exponent_and_a_floor_at_zero_is_degenerate():
    for name, (e, a, alpha) in TRUTH.items():
        rows = points()[name]
        curve = fit_curve([r["train_flops"] for r in rows], [r["test_bpb"] for r in rows])
        assert abs(curve.alpha - alpha) < 0.05 and not curve.degenerate, (name, curve)
    assert fit_curve(BUDGETS[:3], [2.0, 1.9, 1.8]) is None  # three points do not pin three parameters
    assert Curve(0.0, 2.0, 0.08, C).degenerate  # the NPLM's fit: E at its bound 0


# two curves that meet twice: the gap -0.2 + x^-0.5 - 0.2 x^-1.5 is negative, positive, then negative again
TWICE = Curve(1.0, 1.0, 0.5, 1.0), Curve(1.2, 0.2, 1.5, 1.0)


def test_every_crossing_is_found_and_only_inside_the_range_asked():
    both = crossings(*TWICE, 0.05, 200.0)
    assert len(both) == 2 and 0.1 < both[0] < 1 < both[1] < 100
    for x in both:
        assert abs(TWICE[0](x) - TWICE[1](x)) < 1e-9
    assert crossing(*TWICE, 0.05, 200.0) == both[0]
    assert crossings(*TWICE, 1.0, 200.0) == [pytest.approx(both[1])] and crossings(*TWICE, 1.0, both[1] * 0.99) == []


def family(bpb, sd, budgets=BUDGETS):
    return [{"budget": b, "bpb": y, "sd": s, "replicates": [y] if s is None else [y - s, y, y + s]}
            for b, y, s in zip(budgets, bpb, sd)]


def test_an_order_flip_counts_only_beyond_noise_and_a_crossing_only_inside_it():
    a = family([2.50, 2.40, 2.30, 2.20, 2.10], [0.005] * 5)
    b = family([2.45, 2.405, 2.35, 2.25, 2.05], [0.005] * 5)  # b ahead, within noise, a ahead, a ahead, b ahead
    assert measured_flips(a, b) == [(C / 16, C / 4), (C / 2, C)]
    unknown = family([2.45, 2.405, 2.35, 2.25, 2.05], [0.005, 0.005, None, None, 0.005])
    assert measured_flips(a, unknown) == []  # a ahead only at C/4 and C/2, where no sd judges it
    near = family([2.497, 2.40, 2.30, 2.20, 2.103], [0.005] * 5)  # flips, but never beyond 2 sd
    assert measured_flips(a, near) == []
    front = {"a": a, "near": near}
    far = Curve(1.0, 1.0, 0.5, C)  # fitted curves that cross only far outside the budgets: nothing listed
    fits = {m: type("Fit", (), {"usable": True, "curve": far if m == "a" else Curve(1.1, 0.9, 0.5, C)})()
            for m in front}
    assert crossings(fits["a"].curve, fits["near"].curve, C / 1e6, C) and crossing_lines(front, fits, C) == []


def test_the_lack_of_fit_test_keeps_a_true_curve_and_rejects_a_wrong_one():
    rng = np.random.default_rng(1)
    budgets = [C / 64 * 2 ** k for k in range(7)]
    true = [2.0 + 0.3 * (b / C) ** -0.3 for b in budgets]
    kinked = [y + (0.03 if k in (2, 3) else 0.0) for k, y in enumerate(true)]  # a bump no power law follows

    def runs(ys, sd):
        return [{"budget": b, "bpb": float(np.mean(r)), "sd": float(np.std(r, ddof=1)), "replicates": list(r)}
                for b, r in ((b, y + rng.normal(0, sd, 3)) for b, y in zip(budgets, ys))]

    kept = fit_family(runs(true, 0.003), samples=60)
    assert kept.usable and not kept.check.rejected and kept.alpha_interval[0] < 0.3 < kept.alpha_interval[1]
    assert "the form is not rejected (lack-of-fit F = " in kept.text("gru")
    wrong = fit_family(runs(kinked, 0.003), samples=60)
    assert wrong.check.rejected and not wrong.usable and wrong.alpha_interval is None
    assert "the form is rejected (lack-of-fit F = " in wrong.text("lstm") and "gives no interval" in wrong.text("lstm")
    quiet = runs(true, 0.001)
    narrow, wide = (fit_family(data, samples=60, seed=3).alpha_interval for data in (quiet, runs(true, 0.004)))
    assert narrow[1] - narrow[0] < wide[1] - wide[0]  # less noise between seeds, a narrower interval
    assert fit_family(quiet, samples=60, seed=3).alpha_interval == narrow  # the same seed, the same interval


def grid_rows() -> list[dict]:
    """A grid at C/64 .. C/2: three seeds everywhere; the transformer ahead by a lead that closes."""
    rows = []
    for k, b in enumerate(C / 64 * 2 ** k for k in range(6)):
        for m, y, n in (("transformer", 2.6 - 0.06 * k, 2), ("gru", 2.75 - 0.08 * k, 3), ("lstm", 2.78 - 0.085 * k, 3)):
            for size, shift in (("small", 0.02), ("mid", 0.0), ("big", 0.03)):
                reps = [y + shift + d for d in (-0.002, 0.0, 0.002)]
                rows.append({"model": m, "size": size, "budget": b, "n_params": {"small": 1, "mid": 2, "big": 3}[size]
                             * 10_000 * n, "valid_bpb": float(np.mean(reps)), "seeds": 3, "seed_sd": 0.002,
                             "replicates": reps})
    return rows


def test_the_compute_optimal_answer_ranks_in_words_and_says_where_the_grid_stops(tmp_path):
    summary = {"frontier": frontier(grid_rows())}
    assert frontier_points(summary)["gru"][0]["sd"] == 0.002
    lines = section(points(), {}, "compute.png", summary)
    text = "\n".join(lines)
    assert "The grid stops at C/2 (1.50e+13 FLOPs), below the study's budget C = 3.00e+13 FLOPs" in text
    assert ("- C/64 (4.69e+11 FLOPs): transformer 2.600 ± 0.002, then gru 2.750 ± 0.002 (a real gap), then lstm "
            "2.780 ± 0.002 (a real gap)") in lines
    assert "- C/64: +0.150 over gru (a real gap)" in lines
    assert "- C/2: +0.050 over gru (a real gap)" in lines
    assert "### The study's models stopped early: a learning curve at fixed size" in lines
    assert "<" not in text and "≈" not in text and "wsd" not in text and "stable phase" not in text
    assert "- lstm and gru" not in text and "nowhere" in text  # lstm stays behind gru beyond noise: no flip
    compute_figure(points(), {}, None, tmp_path / "compute.png", *grid_fits(summary))
    assert (tmp_path / "compute.png").stat().st_size > 1000
    assert "The scaling grid was trained from other data/tokens" in "\n".join(
        section(points(), {}, "compute.png", summary, ["data/tokens"]))
    assert grid_fits(summary, ["data/tokens"]) == ({}, {})


def test_the_ranking_of_the_stopped_early_models_judges_each_gap_in_words():
    sds = {"transformer": 0.002, "lstm": 0.001, "gru": 0.004}
    lines = ranking(points(), {name: {b: sd for b in BUDGETS} for name, sd in sds.items()}, C)
    assert lines[0].startswith("- C/16 (1.88e+12 FLOPs): lstm ") and "then gru" in lines[0]
    assert lines[0].endswith(f"then transformer {law(*TRUTH['transformer'])[0]:.3f} ± 0.002 (a real gap)")
    assert lines[-1].startswith("- C (3.00e+13 FLOPs): transformer ")


def test_the_report_draws_the_annealed_points_where_a_model_has_them(tmp_path):
    fixture_study(tmp_path)
    for name in ("lstm", "transformer"):
        path = tmp_path / f"metrics/train/{name}.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "budgets": points()[name]}))
    md = build_report(tmp_path, tmp_path / "reports", label="KN-5").read_text()
    section = md[md.index("## As compute grows"):md.index("## Learning curves")]
    assert "alpha" not in section and " cross at" not in section  # a learning curve: no exponents, no crossings
    assert "- C/16 (1.88e+12 FLOPs): lstm 2.128, then transformer 3.002 (one run a point: no gap judged)" in section
    assert (tmp_path / "reports/figures/compute.png").stat().st_size > 1000
    with open(tmp_path / "plots/compute.csv") as f:
        rows = list(csv.DictReader(f))
    assert sorted(float(r["flops"]) for r in rows if r["model"] == "lstm") == [b * 1.0002 for b in BUDGETS]


def test_without_branches_the_report_has_no_such_section(tmp_path):
    fixture_study(tmp_path)
    assert annealed({"lstm": {"train_flops": 1}}) == {}
    assert "As compute grows" not in build_report(tmp_path, tmp_path / "reports", label="KN-5").read_text()


def grid_summary() -> dict:
    """metrics/scaling.json of a grid at C/16, C/8 and C/4: two sizes of the lstm and the transformer each."""
    rows = [{"model": m, "size": f"w{w}", "n_params": w * 10_000, "budget": b, "valid_bpb": bpb}
            for m, w, b, bpb in [("lstm", 16, C / 16, 2.30), ("lstm", 32, C / 16, 2.35), ("lstm", 16, C / 8, 2.25),
                                  ("lstm", 32, C / 8, 2.20), ("transformer", 16, C / 16, 2.40),
                                  ("transformer", 32, C / 16, 2.33), ("transformer", 16, C / 8, 2.31),
                                  ("transformer", 32, C / 8, 2.21), ("transformer", 32, C / 4, 2.10),
                                  ("transformer", 64, C / 4, 2.12)]]
    return {"frontier": frontier(rows),
            "grid": {"overrides": {"batch_size": 16, "seq_len": 64}}}


def test_the_grid_is_compared_with_the_study_at_the_budgets_both_have():
    """Each family's best grid size at a budget against the study's annealed point there; budgets only one of the
    two has are left out; a stale grid and a study without branches are named, not compared."""
    summary = grid_summary()
    assert summary["frontier"]["lstm"] == [
        {"budget": C / 16, "size": "w16", "n_params": 160_000, "valid_bpb": 2.30, "edge": "smallest"},
        {"budget": C / 8, "size": "w32", "n_params": 320_000, "valid_bpb": 2.20, "edge": "largest"}]
    study = {name: [r for r in rows if r["budget_flops"] <= C / 8] for name, rows in points().items()}
    lines = against_grid(study, summary)
    assert lines[0].startswith("The scaling grid (reports/scaling.md: lstm, transformer at 3 budgets from 1.88e+12 "
                               "to 7.50e+12 FLOPs, several sizes each, one seed a run, its own recipe: batch_size 16, "
                               "seq_len 64), against the study's models stopped early")
    table = [row for row in table_rows(lines) if row[0] in ("1.88e+12", "3.75e+12")]
    lstm_16 = law(*TRUTH["lstm"])[0] + 0.2  # the study's valid bpb at C/16
    assert table[0] == ["1.88e+12", "lstm", f"{lstm_16:.4f}", "w16* (0.16M)", "2.3000", f"{lstm_16 - 2.30:+.4f}"]
    assert len(table) == 4  # gru has no grid runs, C/4 and above no study points both have
    assert "- At 1.88e+12 FLOPs the study ranks lstm, then transformer; the grid's best sizes rank lstm, then " \
           "transformer: the same order." in lines
    assert "- At 3.75e+12 FLOPs the study ranks lstm, then transformer; the grid's best sizes rank lstm, then " \
           "transformer: the same order." in lines
    assert lines[-1].startswith("- The grid's best size is below the study's model at 4 of 4 points (mean gap +0.")
    assert against_grid({}, summary)[0].endswith("not compared, as the study has no annealed result at its budgets "
                                                 "(`study.branches` gives them).")
    assert against_grid(study, summary, ["data/tokens"])[0].endswith(
        "not compared, as it was trained from other data/tokens than this study (run `lmpipe scaling` again).")
    assert against_grid(study, None) == [] and against_grid(study, {"stale": []}) == []  # no grid, or an old one
    seeded = {**summary, "seed_spread": [{"budget": C / 64, "seeds": 3, "points": 2, "sd": 0.01}]}
    assert ("several sizes each, one seed a run but at 1 of them, where a point is the mean of 3 seeds, its own "
            "recipe") in against_grid(study, seeded)[0]
    assert against_grid(study, seeded)[-1].endswith("one seed each, so a gap within the study's seed sd is noise.")
    seeded["seed_spread"][0]["budget"] = C / 16  # a budget the study has too
    assert "the study one seed, the grid one or a mean of several" in against_grid(study, seeded)[-1]


def test_with_seeds_at_every_budget_each_gap_is_judged_by_that_budgets_sd(tmp_path):
    """seeds/budgets.csv (`lmpipe seeds` with the branches) gives each point its own sd: the ranking marks a gap real
    or noise at every budget where both models have one, and says ',' where one lacks it."""
    fixture_study(tmp_path)
    evaluation = json.loads((tmp_path / "metrics/eval.json").read_text())["models"]
    seed_rows, budget_rows = [], []
    for name in ("lstm", "transformer"):
        path = tmp_path / f"metrics/train/{name}.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "precision": "bf16", "budgets": points()[name]}))
        made = {"precision": "bf16", "identity": f"{name}-made-so", "machine": "a CPU"}
        path.write_text(json.dumps({**json.loads(path.read_text()), **made}))
        own = seeds.study_row(name, 1234, evaluation[name], made)
        seed_rows += [own] + [{**own, "seed": s, "test_bpb": own["test_bpb"] + d} for s, d in ((1, 0.01), (2, -0.01))]
        budget_rows += seeds.budget_rows(name, 1234, points()[name])
        for s, d in ((1, 0.001), (2, -0.001)):
            kept = [r for r in points()[name] if not (name == "lstm" and r["budget_flops"] == C / 2)]
            budget_rows += seeds.budget_rows(name, s, [{**r, "test_bpb": r["test_bpb"] + d} for r in kept])
    write(tmp_path / "seeds/seeds.csv", seeds.csv_rows(seed_rows))
    write(tmp_path / "seeds/budgets.csv", seeds.csv_rows(budget_rows, seeds.BUDGET_COLUMNS))
    md = build_report(tmp_path, tmp_path / "reports", study_seed=1234, label="KN-5").read_text()
    section = md[md.index("## As compute grows"):md.index("## Learning curves")]
    assert "- C/16 (1.88e+12 FLOPs): lstm 2.128 ± 0.001, then transformer 3.002 ± 0.001 (a real gap)" in section
    assert "(no seed sd to judge it)" in section.split("- C/2 (1.50e+13 FLOPs): ")[1].splitlines()[0]  # lstm
