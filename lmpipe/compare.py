"""Compare a retrain's test metrics with the champions': what changed, and whether a model regressed."""

from __future__ import annotations

import math
from typing import Mapping, NamedTuple, Sequence

from lmpipe.paths import BASELINE
from lmpipe.tables import markdown_table

def baseline_label(ngram) -> str:
    """The n-gram baseline's name from its settings (params.yaml `ngram`): 'KN-5', 'add-k 3-gram', ..."""
    if ngram.method == "kneser_ney":
        return f"KN-{ngram.order}"
    return f"{ngram.method.replace('_', ' ').replace('add k', 'add-k')} {ngram.order}-gram"


CACHE = "cache"  # the unigram cache's name in a combination (lmpipe/combine.py): not a model, so reserved


def best_of(bpb: Mapping[str, float], baseline: str = BASELINE) -> str | None:
    """The neural model with the lowest test bits per byte in `bpb` (one run's, or a mean over seeds); None when
    there is none. The one definition of "the best model" that the report, the README and the benchmarks use."""
    neural = [name for name in bpb if name != baseline]
    return min(neural, key=lambda name: bpb[name], default=None)


MATCHED = 0.01  # a model is compute-matched when its training FLOPs are within 1% of the study's budget


def not_compute_matched(trained: Mapping[str, Mapping], budget_flops: float | None,
                        exceptions: Sequence[str] = ()) -> list[str]:
    """The neural models (metrics/train/<model>.json) that did not train the study's budget: the `exceptions`
    (entries with epochs or a budget of their own, `Params.budget_exceptions`) and any run whose training FLOPs end more than
    1% off it. Their rows are marked and left out of every verdict."""
    if not budget_flops:  # no study budget: nothing claims equal compute
        return []
    return sorted({*exceptions} & set(trained) | {name for name, t in trained.items()
                                                 if abs(t.get("train_flops", 0.0) - budget_flops) > MATCHED * budget_flops})


def best_model(models: Mapping[str, Mapping], baseline: str = BASELINE) -> str | None:
    """The best model of metrics/eval.json-shaped results (`{name: {"test": {"bpb": ...}}}`)."""
    return best_of({name: result["test"]["bpb"] for name, result in models.items()}, baseline)


def without_cache(combinations: Mapping[str, Mapping]) -> dict:
    """The combinations (metrics/combine.json's rows) of trained models alone: those that mix in no unigram cache."""
    return {name: row for name, row in combinations.items() if CACHE not in row["weights"]}


class Scored(NamedTuple):
    """A test result as the tables compare it: bits per byte and word perplexity (one run's, or a mean over seeds:
    lmpipe.seeds.Spread has the same two fields)."""
    bpb: float
    word_ppl: float


def scored(result: Mapping) -> Scored:
    """An eval.json-shaped result's (`{"test": {"bpb": ..., "word_ppl": ...}}`) test numbers."""
    return Scored(result["test"]["bpb"], result["test"]["word_ppl"])


def gap(model, baseline) -> tuple[float, float]:
    """A model against the baseline, the one way README, report, `dvc metrics show` and MLflow state it: the
    difference in test bits per byte (negative: the model is better), and the relative change in word perplexity
    beside it (-0.285: 28.5% lower). Both from what they are given (`Scored` or a seed spread), so a table that shows
    seed means gives the gap of the means."""
    return model.bpb - baseline.bpb, model.word_ppl / baseline.word_ppl - 1


def gap_header(label: str) -> str:
    """The gap column's name, with its unit (`gap_text`)."""
    return f"vs {label}: bpb (word ppl)"


def gap_text(model, baseline) -> str:
    """'-0.124 (-41.6%)': the bpb difference, then the word perplexity change (`gap_header` names them)."""
    bpb, word_ppl = gap(model, baseline)
    return f"{bpb:+.3f} ({100 * word_ppl:+.1f}%)"


METRICS = {"word_ppl": "word ppl", "bpb": "bpb"}  # both gate: bpb is what a model learns, word ppl what the report ranks


def metrics_of(eval_json: Mapping | None) -> dict[str, dict[str, float]]:
    """{model: {word_ppl, bpb}} on the test split, from a metrics/eval.json."""
    return {name: {key: result["test"][key] for key in METRICS}
            for name, result in (eval_json or {}).get("models", {}).items()}


def compare_eval(before: Mapping[str, Mapping], after: Mapping[str, Mapping],
                 max_regression: float) -> tuple[list[dict], list[str]]:
    """One row per model of `after` with each metric before, after and its relative change, and the models worse by
    more than `max_regression` in either metric (a non-finite result is worse than any)."""
    rows, regressed = [], []
    for name, new in sorted(after.items()):
        old = before.get(name) or {}
        row = {"model": name, "version": old.get("version")}
        for key in METRICS:
            was, now = old.get(key), new[key]
            change = None if was is None else (now / was - 1 if math.isfinite(now) else math.inf)
            row[key] = {"before": was, "after": now, "change": change}
        rows.append(row)
        if any((row[key]["change"] or 0) > max_regression for key in METRICS):
            regressed.append(name)
    return rows, regressed


def _cell(value: float | None, digits: int) -> str:
    return "new" if value is None else f"{value:.{digits}f}"


def _change(change: float | None) -> str:
    return "" if change is None else f"{100 * change:+.2f}%"


DIGITS = {"word_ppl": 1, "bpb": 4}


def describe(row: Mapping) -> str:
    """'gru word ppl 120.0 -> 131.2 (+9.33%), bpb 1.9720 -> 1.9931 (+1.07%)'."""
    parts = [f"{label} {_cell(row[key]['before'], DIGITS[key])} -> {_cell(row[key]['after'], DIGITS[key])}"
             + (f" ({_change(row[key]['change'])})" if row[key]["change"] is not None else "")
             for key, label in METRICS.items()]
    return f"{row['model']} " + ", ".join(parts)


def changed(rows: list[dict]) -> list[dict]:
    """The rows whose numbers moved (a model DVC did not retrain keeps them exactly)."""
    return [r for r in rows if any(r[key]["before"] != r[key]["after"] for key in METRICS)]


def comparison_markdown(rows: list[dict], regressed: list[str], max_regression: float) -> str:
    table = []
    for r in rows:
        version = f"v{r['version']}" if r["version"] else "-"
        cells = [c for k in METRICS for c in (_cell(r[k]["before"], DIGITS[k]), _cell(r[k]["after"], DIGITS[k]),
                                              _change(r[k]["change"]))]
        flag = " **regressed**" if r["model"] in regressed else ""
        table.append([f"{r['model']}{flag}", version, *cells])
    lines = ["# Retraining: test metrics, champion vs challenger", ""] + markdown_table(
        ["model", "champion", "word ppl before", "after", "change", "bpb before", "after", "change"], table)
    verdict = (f"Regressed beyond {100 * max_regression:.1f}%: {', '.join(regressed)}." if regressed
               else f"No model regressed beyond {100 * max_regression:.1f}%.")
    return "\n".join(lines + ["", verdict]) + "\n"
