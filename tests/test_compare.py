from lmpipe.compare import compare_eval, comparison_markdown


def result(word_ppl):
    return {"test": {"word_ppl": word_ppl}}


def test_regression_beyond_threshold_is_flagged():
    old = {"models": {"lstm": result(100.0), "gru": result(100.0)}}
    new = {"models": {"lstm": result(104.0), "gru": result(106.0), "transformer": result(90.0)}}
    rows, regressed = compare_eval(old, new, max_regression=0.05)
    assert regressed == ["gru"]
    assert {r["model"]: r["change"] for r in rows}["lstm"] == (104 / 100 - 1)
    text = comparison_markdown(rows, regressed, 0.05)
    assert "| gru | 100.0 | 106.0 | +6.00% **regressed** |" in text and "| transformer | new | 90.0 |  |" in text


def test_first_run_has_nothing_to_regress_from():
    rows, regressed = compare_eval(None, {"models": {"lstm": result(50.0)}}, 0.0)
    assert regressed == [] and rows[0]["before"] is None
