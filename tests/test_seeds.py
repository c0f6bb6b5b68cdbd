"""The seed spread: mean ± sd per model, gaps called real only beyond twice the larger sd, stale rows never shown."""

from __future__ import annotations

import json
import statistics

import pytest

from lmpipe import seeds
from lmpipe.report import build_report
from tests.helpers import fixture_study, has_row, write


def result(bpb: float, word_ppl: float) -> dict:
    return {"valid": {"bpb": bpb + 0.1}, "test": {"bpb": bpb, "word_ppl": word_ppl}}


EVALUATION = {"models": {"ngram": result(2.05, 300.0), "gru": result(1.97, 250.0), "lstm": result(1.98, 255.0),
                         "nplm": result(2.25, 420.0)}}


def rows_for(model: str, extra: list[tuple[int, float]], precision: str = "bf16") -> list[dict]:
    own = seeds.study_row(model, 1234, EVALUATION["models"][model], precision)
    return [own] + [{**own, "seed": seed, "test_bpb": bpb, "valid_bpb": bpb + 0.1, "test_word_ppl": 250 * bpb / 1.97}
                    for seed, bpb in extra]


def test_mean_and_sd_over_a_models_seeds():
    rows = rows_for("gru", [(1, 1.975), (2, 1.965)])
    s = seeds.spread(rows)
    assert s.n == 3 and s.bpb == pytest.approx(statistics.fmean([1.97, 1.975, 1.965]))
    assert s.bpb_sd == pytest.approx(0.005)
    assert s.text() == "1.970 ± 0.005 (3 seeds)"


def test_a_gap_is_real_only_beyond_twice_the_larger_sd():
    a = seeds.Spread(3, 1.970, 0.005, 250, 1)
    assert a.gap_is_real(seeds.Spread(3, 1.981, 0.004, 255, 1)) is True  # 0.011 > 0.010
    assert a.gap_is_real(seeds.Spread(3, 1.979, 0.004, 255, 1)) is False  # 0.009 <= 0.010
    assert a.gap_is_real(seeds.Spread(1, 2.5, None, 400, None)) is None  # one seed: nothing to judge by
    assert a.gap_is_real(seeds.Spread(1, 2.05, 0.0, 300, 0.0)) is True  # the deterministic baseline


def test_the_csv_round_trips_every_digit(tmp_path):
    rows = rows_for("gru", [(1, 1.9751234567891234)])
    (tmp_path / "seeds.csv").write_text(seeds.csv_rows(rows))
    back = seeds.read_rows(tmp_path / "seeds.csv")
    assert [(r["seed"], r["test_bpb"]) for r in back] == [(1, 1.9751234567891234), (1234, 1.97)]  # sorted by seed
    assert seeds.read_rows(tmp_path / "missing.csv") == []


def test_rows_of_a_model_retrained_since_are_stale_and_dropped():
    rows = rows_for("gru", [(1, 1.975), (2, 1.965)]) + rows_for("lstm", [(1, 1.99), (2, 1.97)])
    moved = {"models": {**EVALUATION["models"], "lstm": result(1.95, 240.0)}}  # lstm retrained: its seed row is old
    by_model, stale = seeds.current(rows, moved, 1234, {"gru": "bf16", "lstm": "bf16"})
    assert set(by_model) == {"gru"} and stale == ["lstm"]
    by_model, stale = seeds.current(rows, EVALUATION, 1234, {"gru": "fp32", "lstm": "bf16"})  # other precision
    assert set(by_model) == {"lstm"} and stale == ["gru"]
    by_model, stale = seeds.current(rows, EVALUATION, 7, {})  # another train.seed: no row is the study's
    assert by_model == {} and sorted(stale) == ["gru", "lstm"]


def test_verdicts_state_margins_with_the_sd_and_say_within_noise():
    rows = rows_for("gru", [(1, 1.975), (2, 1.965)]) + rows_for("lstm", [(1, 1.99), (2, 1.97)])
    by_model, _ = seeds.current(rows, EVALUATION, 1234, {})
    lines = seeds.verdicts(seeds.spreads(EVALUATION, by_model, "ngram"), "ngram", "KN-5")
    assert lines[0] == ("**gru**: test 1.970 ± 0.005 (3 seeds) bpb, 0.080 bpb below KN-5 (real: more than 2 x sd "
                        "0.005); the best model; 0.010 bpb below lstm (within noise: not more than 2 x sd 0.010).")
    assert lines[1].startswith("**lstm**: test 1.980 ± 0.010 (3 seeds) bpb, 0.070 bpb below KN-5 (real")
    assert "0.010 bpb above the best model, gru (within noise" in lines[1]
    assert lines[2] == "**nplm**: test 2.250 (1 seed) bpb, 0.200 bpb above KN-5; 0.280 bpb above the best model, gru."


def test_the_family_verdict_sets_the_transformer_against_the_best_recurrent_model():
    rows = rows_for("gru", [(1, 1.975), (2, 1.965)]) + rows_for("lstm", [(1, 1.99), (2, 1.97)])
    evaluation = {"models": {**EVALUATION["models"], "transformer": {"valid": {"bpb": 2.0}, "test": {
        "bpb": 1.93, "word_ppl": 700.0}}}}
    own = seeds.study_row("transformer", 1234, evaluation["models"]["transformer"], "bf16")
    rows += [own] + [{**own, "seed": seed, "test_bpb": bpb} for seed, bpb in ((1, 1.92), (2, 1.94))]
    by_model, _ = seeds.current(rows, evaluation, 1234, {})
    spreads = seeds.spreads(evaluation, by_model, "ngram")
    families = {"gru": "rnn", "lstm": "rnn", "nplm": "nplm", "transformer": "transformer"}
    assert seeds.family_verdict(spreads, families) == (
        "Transformer against the recurrent family: transformer 1.930 ± 0.010 (3 seeds) against the best recurrent "
        "model, gru, 1.970 ± 0.005 (3 seeds): 0.040 bpb below gru (real: more than 2 x sd 0.010).")
    assert seeds.family_verdict(spreads, {"gru": "rnn"}) is None  # no transformer: no sentence


def test_the_report_gives_mean_and_sd_and_dvc_metrics_carry_them(tmp_path):
    fixture_study(tmp_path)
    evaluation = json.loads((tmp_path / "metrics/eval.json").read_text())
    own = seeds.study_row("transformer", 1234, evaluation["models"]["transformer"], "bf16")
    rows = [own, {**own, "seed": 1, "test_bpb": 1.82}, {**own, "seed": 2, "test_bpb": 1.78}]
    stale = seeds.study_row("lstm", 1234, {"valid": {"bpb": 9.0}, "test": {"bpb": 9.0, "word_ppl": 9.0}}, "bf16")
    write(tmp_path / "seeds/seeds.csv", seeds.csv_rows(rows + [stale, {**stale, "seed": 1}]))
    for name in ("lstm", "transformer"):
        path = tmp_path / f"metrics/train/{name}.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "precision": "bf16"}))
    md = build_report(tmp_path, tmp_path / "reports", study_seed=1234, label="KN-5").read_text()
    section = md[md.index("## Seeds and verdicts"):]
    assert has_row(section, "transformer", "3", "1.800 ± 0.020")
    assert has_row(section, "lstm", "1", "2.100") and "Stale seed runs, not shown: lstm" in section
    assert "- **transformer**: test 1.800 ± 0.020 (3 seeds) bpb, 0.200 bpb below KN-5 (real" in section
    summary = json.loads((tmp_path / "metrics/models/transformer.json").read_text())
    assert summary["seeds"] == 3 and summary["bpb_mean"] == 1.8 and summary["bpb_sd"] == 0.02
    assert "seeds" not in json.loads((tmp_path / "metrics/models/lstm.json").read_text())


def test_each_budget_gets_the_sd_of_its_seeds_while_the_study_seeds_rows_hold(tmp_path):
    """seeds/budgets.csv: an sd per model and budget over the seeds that have it; a model whose study-seed rows no
    longer carry the study's annealed numbers (retrained since) gets none."""
    study = [{"budget_flops": b, "train_flops": b * 1.001, "valid_bpb": y + 0.1, "test_bpb": y}
             for b, y in ((1.5e13, 2.10), (3e13, 1.97))]
    seed_runs = {1: (2.12, 1.975), 2: (2.08, 1.965)}
    rows = seeds.budget_rows("gru", 1234, study) + [
        row for seed, ys in seed_runs.items()
        for row in seeds.budget_rows("gru", seed, [{**r, "test_bpb": y} for r, y in zip(study, ys)])]
    (tmp_path / "budgets.csv").write_text(seeds.csv_rows(rows, seeds.BUDGET_COLUMNS))
    back = seeds.read_rows(tmp_path / "budgets.csv")
    assert sorted(back, key=lambda r: (r["seed"], r["budget_flops"])) == sorted(
        rows, key=lambda r: (r["seed"], r["budget_flops"]))  # every digit back
    sds = seeds.budget_sds(back, {"gru": study}, 1234, ["gru"])
    assert sds["gru"][1.5e13] == pytest.approx(0.02) and sds["gru"][3e13] == pytest.approx(0.005)
    assert seeds.budget_sds(back, {"gru": study}, 1234, []) == {}  # its seed rows at C are stale
    moved = [{**r, "test_bpb": r["test_bpb"] - 0.01} for r in study]  # retrained since: the study's numbers moved
    assert seeds.budget_sds(back, {"gru": moved}, 1234, ["gru"]) == {}
    assert seeds.budget_sds(back, {"gru": study}, 7, ["gru"]) == {}  # another train.seed: no row is the study's
