"""Compare two runs of the study's metrics: what a retraining changed, and whether a model regressed."""

from __future__ import annotations


def compare_eval(old: dict | None, new: dict, max_regression: float) -> tuple[list[dict], list[str]]:
    """Rows of old vs new test word perplexity per model, and the models worse by more than `max_regression`."""
    old_models = (old or {}).get("models", {})
    rows, regressed = [], []
    for name, result in sorted(new.get("models", {}).items()):
        after = result["test"]["word_ppl"]
        before = old_models.get(name, {}).get("test", {}).get("word_ppl")
        change = None if before is None else after / before - 1
        rows.append({"model": name, "before": before, "after": after, "change": change})
        if change is not None and change > max_regression:
            regressed.append(name)
    return rows, regressed


def comparison_markdown(rows: list[dict], regressed: list[str], max_regression: float) -> str:
    lines = ["# Retraining: test word perplexity", "", "| model | before | after | change |", "|---|---|---|---|"]
    for r in rows:
        before = "new" if r["before"] is None else f"{r['before']:.1f}"
        change = "" if r["change"] is None else f"{100 * r['change']:+.2f}%"
        flag = " **regressed**" if r["model"] in regressed else ""
        lines.append(f"| {r['model']} | {before} | {r['after']:.1f} | {change}{flag} |")
    verdict = (f"Regressed beyond {100 * max_regression:.1f}%: {', '.join(regressed)}." if regressed
               else f"No model regressed beyond {100 * max_regression:.1f}%.")
    return "\n".join(lines + ["", verdict]) + "\n"
