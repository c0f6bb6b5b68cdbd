"""The seed spread: mean ± sd per model, gaps called real only beyond twice the larger sd, stale rows never shown."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from lmpipe import seeds
from lmpipe.report import build_report
from tests.helpers import fixture_study, table_rows, write


def result(bpb: float, word_ppl: float) -> dict:
    return {"valid": {"bpb": bpb + 0.1}, "test": {"bpb": bpb, "word_ppl": word_ppl}}


EVALUATION = {"models": {"ngram": result(2.05, 300.0), "gru": result(1.97, 250.0), "lstm": result(1.98, 255.0),
                         "nplm": result(2.25, 420.0)}}


ZEN5, XEON = "AMD family 26, AVX512-BF16", "Intel family 6, AMX"
TRAINED = {m: {"precision": "bf16", "identity": f"{m}-made-so", "machine": ZEN5} for m in EVALUATION["models"]}


def rows_for(model: str, extra: list[tuple[int, float]], precision: str = "bf16") -> list[dict]:
    own = seeds.study_row(model, 1234, EVALUATION["models"][model], {**TRAINED[model], "precision": precision})
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
    moved = {"models": {**EVALUATION["models"], "lstm": result(1.95, 240.0)}}  # lstm retrained: 3 sd off its row
    by_model, stale = seeds.current(rows, moved, 1234, TRAINED)
    assert set(by_model) == {"gru"} and list(stale) == ["lstm"] and "3.0 seed sds" in stale["lstm"]
    other_code = {**TRAINED, "gru": {**TRAINED["gru"], "identity": "gru-made-otherwise"}}  # same numbers, new code
    by_model, stale = seeds.current(rows, EVALUATION, 1234, other_code)
    assert set(by_model) == {"lstm"} and stale == {"gru": seeds.STALE_IDENTITY}
    by_model, stale = seeds.current(rows, EVALUATION, 7, TRAINED)  # another train.seed: no row is the study's
    assert by_model == {} and sorted(stale) == ["gru", "lstm"]
    unrecorded = [{**r, "identity": ""} for r in rows]  # rows written before identities were: stale, said so
    assert seeds.current(unrecorded, EVALUATION, 1234, TRAINED)[1] == {"gru": seeds.STALE_IDENTITY,
                                                                       "lstm": seeds.STALE_IDENTITY}


def test_a_study_remade_on_another_machine_keeps_its_spread_within_noise_and_says_differs_beyond():
    """The machine and the precision are provenance: a run of the study's seed on another CPU, in fp32, within
    twice the sd of its committed row keeps the rows; one beyond it makes them stale, with the distance."""
    rows = rows_for("gru", [(1, 1.975), (2, 1.965)]) + rows_for("lstm", [(1, 1.99), (2, 1.97)])
    here = {m: {**t, "precision": "fp32", "machine": XEON} for m, t in TRAINED.items()}
    nudged = {"models": {**EVALUATION["models"], "gru": result(1.97 + 0.004, 250.3),  # 0.8 sd (0.005)
                         "lstm": result(1.98 - 0.018, 254.0)}}  # 1.8 sd (0.01)
    by_model, stale = seeds.current(rows, nudged, 1234, here)
    assert set(by_model) == {"gru", "lstm"} and stale == {}
    seen = seeds.provenance(rows, nudged, 1234, here, ["gru", "lstm"])
    assert seen["gru"]["rows"] == [(ZEN5, "bf16")] and seen["gru"]["run"] == (XEON, "fp32")
    assert seen["gru"]["reproduction"] == seeds.Reproduction(seeds.WITHIN_NOISE, pytest.approx(0.8))
    assert seen["lstm"]["reproduction"].text() == "within noise, 1.8 sd"
    beyond = {"models": {**nudged["models"], "gru": result(1.97 + 0.0101, 251.0)}}  # 2.02 sd
    by_model, stale = seeds.current(rows, beyond, 1234, here)
    assert set(by_model) == {"lstm"} and "differs from its committed row of seed 1234 by 2.0 seed sds" in stale["gru"]
    assert seeds.provenance(rows, EVALUATION, 1234, TRAINED, ["gru"])["gru"]["reproduction"].verdict == "bit for bit"


def test_each_re_made_number_is_judged_in_its_own_splits_seed_sd():
    """As the study's LSTM: its seeds' valid bpb spread 2.6 times as far as their test bpb (sd 0.0026 against
    0.0010). A re-made run 0.0022 off on valid is 0.85 of the valid sd, within noise, not 2.2 of the test sd; the
    same move on test is beyond noise."""
    own = seeds.study_row("lstm", 1234, result(1.9456, 5029.0), TRAINED["lstm"])
    rows = [own, {**own, "seed": 1, "valid_bpb": own["valid_bpb"] + 0.0052, "test_bpb": 1.9475},
            {**own, "seed": 2, "valid_bpb": own["valid_bpb"] + 0.0030, "test_bpb": 1.9457}]
    sds = seeds.split_sds(rows)
    assert sds["valid"] == pytest.approx(0.0026, abs=1e-4) and sds["test"] == pytest.approx(0.0011, abs=1e-4)
    valid_moved = {"models": {"lstm": {"valid": {"bpb": own["valid_bpb"] - 0.0022}, "test": {"bpb": 1.9456}}}}
    assert seeds.current(rows, valid_moved, 1234, TRAINED)[1] == {}  # the rows hold
    seen = seeds.provenance(rows, valid_moved, 1234, TRAINED, ["lstm"])["lstm"]["reproduction"]
    assert seen.verdict == seeds.WITHIN_NOISE and seen.sds == pytest.approx(0.0022 / sds["valid"])
    test_moved = {"models": {"lstm": {"valid": {"bpb": own["valid_bpb"]}, "test": {"bpb": 1.9456 - 0.0025}}}}
    assert "differs from its committed row" in seeds.current(rows, test_moved, 1234, TRAINED)[1]["lstm"]
    assert seeds.reproduction({"valid_bpb": 2.0}, {"valid_bpb": 2.001}, {"valid": None, "test": 0.1}).verdict == \
        seeds.DIFFERS  # no sd of the split that moved: only equality holds


def test_verdicts_state_margins_with_the_sd_and_say_within_noise():
    rows = rows_for("gru", [(1, 1.975), (2, 1.965)]) + rows_for("lstm", [(1, 1.99), (2, 1.97)])
    by_model, _ = seeds.current(rows, EVALUATION, 1234, TRAINED)
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
    made = {**TRAINED, "transformer": {**TRAINED["gru"], "identity": "transformer-made-so"}}
    own = seeds.study_row("transformer", 1234, evaluation["models"]["transformer"], made["transformer"])
    rows += [own] + [{**own, "seed": seed, "test_bpb": bpb} for seed, bpb in ((1, 1.92), (2, 1.94))]
    by_model, _ = seeds.current(rows, evaluation, 1234, made)
    spreads = seeds.spreads(evaluation, by_model, "ngram")
    families = {"gru": "rnn", "lstm": "rnn", "nplm": "nplm", "transformer": "transformer"}
    assert seeds.family_verdict(spreads, families) == (
        "Transformer against the recurrent family: transformer 1.930 ± 0.010 (3 seeds) against the best recurrent "
        "model, gru, 1.970 ± 0.005 (3 seeds): 0.040 bpb below gru (real: more than 2 x sd 0.010).")
    assert seeds.family_verdict(spreads, {"gru": "rnn"}) is None  # no transformer: no sentence


def results_row(md: str, model: str) -> dict[str, str]:
    """A model's row of the report's results table (*Perplexity*), by column name."""
    head, *rows = table_rows(md[md.index("## Perplexity"):md.index("![Test bits per byte]")])
    return next(dict(zip(head, row)) for row in rows if row[0] == model)


def summary_of(root: Path, model: str) -> dict:
    """A model's row of `dvc metrics show` (metrics/models/<rank>-<model>.json), as the publish stage writes them
    from the report's source."""
    from lmpipe import summaries
    from lmpipe.results import load_results

    results = load_results(root, study_seed=1234)
    summaries.write(root, results.spreads, results.trained, "KN-5")
    (path,) = (root / "metrics/models").glob(f"*-{model}.json")
    return json.loads(path.read_text())


def test_the_report_gives_mean_and_sd_and_dvc_metrics_carry_them(tmp_path):
    fixture_study(tmp_path)
    evaluation = json.loads((tmp_path / "metrics/eval.json").read_text())
    made = {"precision": "bf16", "identity": "made-so", "machine": ZEN5}
    for name in ("lstm", "transformer"):
        path = tmp_path / f"metrics/train/{name}.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **made}))
    own = seeds.study_row("transformer", 1234, evaluation["models"]["transformer"], made)
    rows = [own, {**own, "seed": 1, "test_bpb": 1.82}, {**own, "seed": 2, "test_bpb": 1.78}]
    stale = seeds.study_row("lstm", 1234, {"valid": {"bpb": 9.0}, "test": {"bpb": 9.0, "word_ppl": 9.0}}, made)
    write(tmp_path / "seeds/seeds.csv", seeds.csv_rows(rows + [stale, {**stale, "seed": 1}]))
    md = build_report(tmp_path, tmp_path / "reports", study_seed=1234, label="KN-5").read_text()
    section = md[md.index("## Seeds and verdicts"):]
    assert [results_row(md, "transformer")[k] for k in ("seeds", "test bpb")] == ["3", "1.800 ± 0.020"]
    assert [results_row(md, "lstm")[k] for k in ("seeds", "test bpb")] == ["1", "2.100"]
    assert "Stale seed runs, not shown: lstm, this run differs" in section
    assert f"Seed rows made on {ZEN5} (bf16); this run on {ZEN5} (bf16), which reproduces every model's" in section
    assert "- **transformer**: test 1.800 ± 0.020 (3 seeds) bpb, 0.200 bpb below KN-5 (real" in section
    assert summary_of(tmp_path, "transformer") == {"bpb": 1.8, "sd": 0.02, "vs_kn5": -0.2, "tflop": 34.0}
    assert "sd" not in summary_of(tmp_path, "lstm")


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
    moved = [{**r, "test_bpb": r["test_bpb"] - 0.011} for r in study]  # retrained since: 2.2 sd off at C
    assert seeds.budget_sds(back, {"gru": moved}, 1234, ["gru"]) == {}
    nudged = [{**r, "test_bpb": r["test_bpb"] - 0.009} for r in study]  # another machine: within 2 sd everywhere
    assert seeds.budget_sds(back, {"gru": nudged}, 1234, ["gru"]) == sds
    assert seeds.budget_sds(back, {"gru": study}, 7, ["gru"]) == {}  # another train.seed: no row is the study's


def test_a_foreign_machines_study_keeps_its_verdicts_within_noise_and_says_differs_beyond(tmp_path):
    """The report of a study re-made elsewhere: each model's numbers perturbed within its seed sd keep every
    spread and verdict, and the report names both machines and the distance; one perturbed beyond twice its sd
    loses its spread, and the report says it differs."""
    fixture_study(tmp_path)
    committed = json.loads((tmp_path / "metrics/eval.json").read_text())
    rows = []
    for name, sd in (("lstm", 0.01), ("transformer", 0.02)):
        made = {"precision": "bf16", "identity": f"{name}-made-so", "machine": ZEN5}
        write(tmp_path / f"metrics/train/{name}.json",
              {**json.loads((tmp_path / f"metrics/train/{name}.json").read_text()), **made})
        own = seeds.study_row(name, 1234, committed["models"][name], made)
        rows += [own] + [{**own, "seed": s, "test_bpb": own["test_bpb"] + d * sd, "valid_bpb": own["valid_bpb"] + d * sd}
                         for s, d in ((1, -1), (2, 1))]
    write(tmp_path / "seeds/seeds.csv", seeds.csv_rows(rows))

    def remade(moves: dict[str, float]) -> str:
        evaluation = json.loads(json.dumps(committed))
        for name, move in moves.items():
            for split in ("valid", "test"):
                evaluation["models"][name][split]["bpb"] += move
            path = tmp_path / f"metrics/train/{name}.json"
            write(path, {**json.loads(path.read_text()), "machine": XEON, "precision": "fp32"})
        write(tmp_path / "metrics/eval.json", evaluation)
        md = build_report(tmp_path, tmp_path / "reports", study_seed=1234, label="KN-5").read_text()
        return md[md.index("## Perplexity"):]  # the means' table, then the verdicts

    section = remade({"lstm": 0.015, "transformer": -0.01})  # 1.5 and 0.5 sd
    assert [results_row(section, m)["test bpb"] for m in ("lstm", "transformer")] == ["2.100 ± 0.010", "1.800 ± 0.020"]
    assert "- **transformer**: test 1.800 ± 0.020 (3 seeds) bpb, 0.200 bpb below KN-5 (real" in section
    assert (f"Seed rows made on {ZEN5} (bf16); this run on {XEON} (fp32), which against its committed row of the same "
            "seed, in that model's seed sds: lstm within noise, 1.5 sd, transformer within noise, 0.5 sd.") in section
    assert "Stale" not in section and summary_of(tmp_path, "lstm")["sd"] == 0.01

    section = remade({"lstm": 0.025})  # 2.5 sd: differs
    assert results_row(section, "lstm")["test bpb"] == "2.125" and "lstm, this run differs from its committed row of seed 1234 " \
                                                     "by 2.5 seed sds" in section
    assert "sd" not in summary_of(tmp_path, "lstm")


def test_weat_effect_sizes_over_seeds_say_which_lie_beyond_their_noise(tmp_path):
    """seeds/weat.csv: each effect size's mean and sd over a model's seeds; beyond noise only where the mean lies
    more than twice the sd from zero; the report gives both beside this run's number."""
    effects = {1234: {"weat7": 0.12, "weat8": 0.55}, 1: {"weat7": -0.48, "weat8": 0.80}, 2: {"weat7": 0.30,
                                                                                         "weat8": 0.70}}
    rows = [row for seed, by_test in effects.items() for row in seeds.weat_rows(
        "lstm", seed, {t: {"effect_size": d, "p_value": 0.1} for t, d in by_test.items()})]
    (tmp_path / "weat.csv").write_text(seeds.csv_rows(rows, seeds.WEAT_COLUMNS))
    back = seeds.read_rows(tmp_path / "weat.csv")
    spread = seeds.weat_spreads(back, ["lstm"])["lstm"]
    assert spread["weat7"].n == 3 and spread["weat7"].mean == pytest.approx(statistics.fmean([0.12, -0.48, 0.30]))
    assert spread["weat7"].beyond_noise is False and spread["weat8"].beyond_noise is True
    assert spread["weat8"].text() == "+0.68 ± 0.13 (3 seeds, beyond noise)"
    assert seeds.weat_spreads(back, []) == {}  # a model whose seed rows do not hold gets none
    assert seeds.weat_spreads([r for r in back if r["seed"] == 1234], ["lstm"]) == {}  # its own audit alone

    fixture_study(tmp_path)
    made = {"precision": "bf16", "identity": "made-so", "machine": ZEN5}
    path = tmp_path / "metrics/train/lstm.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **made}))
    own = seeds.study_row("lstm", 1234, json.loads((tmp_path / "metrics/eval.json").read_text())["models"]["lstm"], made)
    write(tmp_path / "seeds/seeds.csv", seeds.csv_rows([own, {**own, "seed": 1}, {**own, "seed": 2, "test_bpb": 2.2}]))
    rows = [row for seed, d in ((1234, 1.2), (1, 1.0), (2, 1.4)) for row in seeds.weat_rows(
        "lstm", seed, {"flowers_insects": {"effect_size": d, "p_value": 0.01}})]
    write(tmp_path / "seeds/weat.csv", seeds.csv_rows(rows, seeds.WEAT_COLUMNS))
    md = build_report(tmp_path, tmp_path / "reports", study_seed=1234, label="KN-5").read_text()
    section = md[md.index("## Bias audit (WEAT)"):]
    assert "1.20 (p=0.010, q=0.010); seeds +1.20 ± 0.20 (3 seeds, beyond noise)" in section
    assert "Over the seeds (seeds/weat.csv: lstm)" in section
