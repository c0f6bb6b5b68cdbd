import math

from lmpipe.compare import changed, compare_eval, comparison_markdown, describe, metrics_of
from tests.helpers import has_row, table_rows


def result(word_ppl, bpb=2.0):
    return {"test": {"word_ppl": word_ppl, "bpb": bpb, "ppl": 1.0, "loss": 1.0}}


def test_regression_beyond_threshold_in_either_metric_is_flagged():
    champions = {"lstm": {"word_ppl": 100.0, "bpb": 2.0, "version": "3"}, "gru": {"word_ppl": 100.0, "bpb": 2.0},
                 "rnn": {"word_ppl": 100.0, "bpb": 2.0}}
    new = metrics_of({"models": {"lstm": result(104.0), "gru": result(106.0), "rnn": result(99.0, 2.2),
                                 "transformer": result(90.0)}})
    rows, regressed = compare_eval(champions, new, max_regression=0.05)
    assert regressed == ["gru", "rnn"]  # word ppl +6%; bpb +10% though word ppl improved
    by_model = {r["model"]: r for r in rows}
    assert by_model["lstm"]["word_ppl"]["change"] == 104 / 100 - 1 and by_model["lstm"]["bpb"]["change"] == 0
    text = comparison_markdown(rows, regressed, 0.05)
    assert ["gru **regressed**", "-", "100.0", "106.0", "+6.00%", "2.0000", "2.0000", "+0.00%"] in table_rows(text)
    assert has_row(text, "lstm", "v3", "100.0", "104.0", "+4.00%") and has_row(text, "transformer", "-", "new", "90.0", "")
    assert text.rstrip().endswith("Regressed beyond 5.0%: gru, rnn.")
    assert describe(by_model["gru"]) == "gru word ppl 100.0 -> 106.0 (+6.00%), bpb 2.0000 -> 2.0000 (+0.00%)"
    assert [r["model"] for r in changed(rows)] == ["gru", "lstm", "rnn", "transformer"]


def test_a_model_that_did_not_retrain_has_not_changed_and_a_first_run_regresses_nothing():
    same = metrics_of({"models": {"lstm": result(50.0)}})
    rows, regressed = compare_eval(same, same, 0.0)
    assert regressed == [] and changed(rows) == []
    rows, regressed = compare_eval({}, same, 0.0)
    assert regressed == [] and rows[0]["word_ppl"]["before"] is None


def test_a_diverged_model_regresses_whatever_the_threshold():
    rows, regressed = compare_eval({"gru": {"word_ppl": 100.0, "bpb": 2.0}},
                                   {"gru": {"word_ppl": math.inf, "bpb": math.nan}}, max_regression=1e9)
    assert regressed == ["gru"] and rows[0]["word_ppl"]["change"] == math.inf
