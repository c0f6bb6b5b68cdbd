"""The study report builds from metrics files alone and carries every section."""

from __future__ import annotations

import json

from lmpipe.report import build_report


def write(path, obj):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj) if not isinstance(obj, str) else obj)


def fixture_study(root, with_weat=True):
    split = {"articles": 10, "lines": 100, "words": 1000, "chars": 6000}
    write(root / "metrics/corpus.json", {"source": "enwiki-sample", "splits": {s: split for s in ("train", "valid", "test")},
                                         "sha256": {}})
    write(root / "metrics/validation.json", {"success": True, "evaluated": 12, "failed": 0})
    write(root / "metrics/tokenize.json", {"vocab_size": 8192, "tokens": {"train": 1700}, "words": {"train": 1000}})
    result = lambda p: {"ppl": p, "word_ppl": p * 3, "bpb": 2.0, "loss": 5.0}  # noqa: E731
    write(root / "metrics/eval.json", {"models": {
        "ngram": {"valid": result(260), "test": result(240), "n_params": 1000},
        "lstm": {"valid": result(300), "test": result(280), "n_params": 4_000_000},
        "transformer": {"valid": result(200), "test": result(190), "n_params": 5_000_000},
    }})
    write(root / "plots/train/lstm.csv", "epoch,valid_ppl\n1,900\n2,300\n")
    write(root / "plots/train/transformer.csv", "epoch,valid_ppl\n1,700\n2,200\n")
    write(root / "reports/samples.md", "# Decoding samples\n\n## Diversity per strategy (mean over models)\n\n"
                                       "| strategy | distinct-1 |\n|---|---|\n| greedy | 0.2 |\n\n## lstm\n\n### greedy\n- The history of x\n")
    if with_weat:
        write(root / "metrics/weat.json", {"models": {"lstm": {
            "flowers_insects": {"effect_size": 1.2, "p_value": 0.01, "x_words": 8, "y_words": 8, "a_words": 20,
                                "b_words": 20},
            "math_arts": {"effect_size": None, "p_value": None, "status": "insufficient_coverage", "x_words": 2,
                          "y_words": 8, "a_words": 20, "b_words": 20}}}})


def test_report_has_every_section(tmp_path):
    fixture_study(tmp_path)
    md = build_report(tmp_path, tmp_path / "reports").read_text()
    for heading in ("## Corpus", "## Tokenizer", "## Perplexity", "## Learning curves", "## Decoding samples",
                    "## Bias audit (WEAT)"):
        assert heading in md
    table = md[md.index("## Perplexity"):md.index("## Learning curves")]
    assert table.index("| transformer |") < table.index("| ngram (baseline) |") < table.index("| lstm |")
    assert "Best neural model: **transformer**, which beats" in md
    assert "1.20 (p=0.010) [8/8/20/20]" in md and "insufficient_coverage [2/8/20/20]" in md
    html = (tmp_path / "reports/study.html").read_text()
    assert html.count("data:image/png;base64,") == 2 and "<table>" in html
    assert (tmp_path / "reports/figures/learning_curves.png").stat().st_size > 1000


def test_report_without_audit_says_so(tmp_path):
    fixture_study(tmp_path, with_weat=False)
    md = build_report(tmp_path, tmp_path / "reports").read_text()
    assert "The audit stage has not run yet." in md
