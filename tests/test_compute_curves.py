"""The report's "As compute grows": fitted curves recover known exponents, crossings and the ranking at each budget
come out where the numbers put them, and the report and compute.csv use the annealed points."""

from __future__ import annotations

import csv
import json
import math

import numpy as np

from lmpipe import seeds
from lmpipe.compute_curves import (against_grid, annealed, crossing, crossing_interval, fit_curve, lead_sentence,
                                   ranking)
from lmpipe.scaling import frontier
from lmpipe.report import build_report
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


def test_the_fit_recovers_each_exponent_within_its_interval():
    for name, (e, a, alpha) in TRUTH.items():
        rows = points()[name]
        curve = fit_curve([r["train_flops"] for r in rows], [r["test_bpb"] for r in rows])
        assert abs(curve.alpha - alpha) < 0.05, (name, curve)
        assert curve.alpha_interval[0] < alpha < curve.alpha_interval[1]
    assert fit_curve(BUDGETS[:3], [2.0, 1.9, 1.8]) is None  # three points do not pin three parameters


def test_crossings_are_found_where_the_curves_meet_and_not_elsewhere():
    fits = {name: fit_curve([r["train_flops"] for r in rows], [r["test_bpb"] for r in rows])
            for name, rows in points().items()}
    at = crossing(fits["transformer"], fits["lstm"], C / 32, 2 * C)
    exact = next(x for x in np.geomspace(C / 2, C, 2000) if 1.6 + 0.35 * (x / C) ** -0.5 < 1.85 + 0.12 * (x / C) ** -0.3)
    assert C / 2 < at < C and abs(math.log(at / exact)) < 0.05
    band = crossing_interval(fits["transformer"], fits["lstm"], C / 32, 2 * C)
    assert band[0] <= at <= band[1]
    assert crossing(fits["lstm"], fits["gru"], C / 32, 2 * C) is None  # parallel, 0.02 apart


def test_the_ranking_marks_real_gaps_and_the_lead_sentence_says_which_way_it_moves():
    sds = {"transformer": 0.002, "lstm": 0.001, "gru": 0.004}
    lines = ranking(points(), {name: {b: sd for b in BUDGETS} for name, sd in sds.items()})
    assert lines[0].startswith("- 1.88e+12 FLOPs: lstm ") and "< gru" in lines[0] and lines[0].endswith(
        f"< transformer {law(*TRUTH['transformer'])[0]:.3f}")
    assert lines[-1].startswith("- 3.00e+13 FLOPs: transformer ")
    sentence = lead_sentence(points())
    assert sentence.startswith("The transformer's lead over the best recurrent model grows from 1.88e+12 to 3.00e+13 "
                               "FLOPs: -0.")
    assert "over lstm at 1.88e+12, " in sentence and "over lstm at 3.00e+13 (positive" in sentence
    assert sentence.endswith("It is ahead at 3.00e+13 and behind at 1.88e+12, 3.75e+12, 7.50e+12, 1.50e+13.")
    # ahead at the ends, behind between (as the study's own points were): neither "grows" nor "closes"
    wavy = points()
    for row, shift in zip(wavy["transformer"], (-1.0, 0.0, 0.0, 0.0, 0.0)):
        row["test_bpb"] += shift
    sentence = lead_sentence(wavy)
    assert "model moves both ways from" in sentence and "It is ahead at 1.88e+12, 3.00e+13 and behind at" in sentence


def test_the_report_draws_the_annealed_points_where_a_model_has_them(tmp_path):
    fixture_study(tmp_path)
    for name in ("lstm", "transformer"):
        path = tmp_path / f"metrics/train/{name}.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "budgets": points()[name]}))
    md = build_report(tmp_path, tmp_path / "reports", label="KN-5").read_text()
    section = md[md.index("## As compute grows"):md.index("## Learning curves")]
    assert "- transformer: alpha 0.50 [" in section and "- lstm and transformer cross at 2.6" in section
    assert "- 1.88e+12 FLOPs: lstm 2.128, transformer 3.002" in section  # no seed sd here: no verdict on the gap
    assert "The transformer's lead over the best recurrent model grows" in section
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
                               "seq_len 64), against the study's annealed points")
    table = [row for row in table_rows(lines) if row[0] in ("1.88e+12", "3.75e+12")]
    lstm_16 = law(*TRUTH["lstm"])[0] + 0.2  # the study's valid bpb at C/16
    assert table[0] == ["1.88e+12", "lstm", f"{lstm_16:.4f}", "w16* (0.16M)", "2.3000", f"{lstm_16 - 2.30:+.4f}"]
    assert len(table) == 4  # gru has no grid runs, C/4 and above no study points both have
    assert "- At 1.88e+12 FLOPs the study ranks lstm < transformer; the grid's best sizes rank lstm < transformer: " \
           "the same order." in lines
    assert "- At 3.75e+12 FLOPs the study ranks lstm < transformer; the grid's best sizes rank lstm < transformer: " \
           "the same order." in lines
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
    assert "- 1.88e+12 FLOPs: lstm 2.128 < transformer 3.002" in section  # sd 0.001 at C/16: a real gap
    assert "- 1.50e+13 FLOPs: " in section and ", " in section.split("- 1.50e+13 FLOPs: ")[1].splitlines()[0]
