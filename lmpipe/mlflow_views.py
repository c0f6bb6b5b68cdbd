"""The MLflow views `lmpipe ui` links to, saved the way the UI's own "Share" button saves a view: an experiment tag
`mlflow.sharedViewState.<key>` holding the view's state, opened by `?viewStateShareKey=<key>`. So the link answers
"which model is best" without a click: the rows the publish stage made for the models the workspace holds (a run
per model under its own run, the n-gram's included), sorted by test bits per byte, with the headline metrics as
columns (token perplexity is left out: it is not comparable across tokenizations). The compare view puts the runs
that trained them side by side, in the same order."""

from __future__ import annotations

import hashlib
import json
import urllib.parse


from lmpipe import paths
from lmpipe.compare import gap
from lmpipe.paths import BASELINE
from lmpipe.tracking import LABELS, run_of_output, tracker
from lmpipe.tracking.runs import ROLE

SHARED_VIEW = "mlflow.sharedViewState."  # MLflow's tag prefix for a shared view (its UI reads it back)


SORT_METRIC = "test_bpb_mean"  # a model run's test bpb as every table shows it: the mean over its seeds, else its own
MADE_BY = "lmpipe.made_by"  # on a published row: the run that made the model (its training; the n-gram's stage)
MODEL, MODEL_HASH = "lmpipe.model", "lmpipe.model_sha256"  # and the model, its files' content hash
PUBLISHED = "published"  # a row's lmpipe.role (a stage's run is "stage", the study's "study")
VIEW_ROWS = 400  # a shared view lists its runs in one experiment tag, which MLflow caps at 20,000 characters


def labels(name: str, shown, baseline: tuple[str, object], n_params: float, train_flops: float | None) -> dict[str, str]:
    """A model run's numbers as a person reads them, the views' columns: MLflow shows a metric's every digit, cut to
    the cell (`1.92056884…`), so the views show these tags and sort by the exact metric (SORT_METRIC). `shown`: the
    model's test numbers as the report's tables give them (lmpipe.seeds.Spread: the mean over seeds where they hold,
    with its sd); `baseline`: the n-gram's label and its numbers, the gap to it in bpb (lmpipe.compare.gap). Each
    fits MLflow's 100-px cell whole (76 px of text: "1.921 ± 0.002" takes 73, "1.75M n-grams" 81, "470k n-grams"
    73). Size: a model's parameters in millions; the n-gram's n-grams (`short_count`)."""
    label, kn = baseline
    spread = f" ± {shown.bpb_sd:.3f}" if shown.bpb_sd and name != BASELINE else ""
    return {"test bpb": f"{shown.bpb:.3f}{spread}",  # in the order the views show them (MLflow's: the tags')
            f"vs {label}": "baseline" if name == BASELINE else f"{gap(shown, kn)[0]:+.3f} bpb",
            "word ppl": f"{shown.word_ppl:,.0f}",
            "size": f"{short_count(n_params)} n-grams" if name == BASELINE else f"{n_params / 1e6:.2f}M",
            "training FLOPs": f"{train_flops:.2e}" if train_flops else "-"}


def short_count(n: float) -> str:
    """A count in two or three digits and k or M: 470k, 1.8M, 12M (the n-gram's size, whole in its cell)."""
    value, unit = (n / 1e6, "M") if n >= 999_500 else (n / 1e3, "k")
    return f"{value:.2g}{unit}" if value < 10 else f"{value:.0f}{unit}"


def column(metric: str, kind: str = "metrics") -> str:
    """A metric's (or tag's) column key as the MLflow UI spells it (its `makeCanonicalSortKey`)."""
    return f"{kind}.`{metric}`"


def columns(baseline_label: str) -> list[str]:
    """The columns every view shows, in order: the labels (`labels`), the gap to the baseline second."""
    return [column(k, "tags") for k in (LABELS[0], f"vs {baseline_label}", *LABELS[1:])]


def published_runs(experiment: str) -> list[str]:
    """The rows the publish stage made of the models now in the workspace (under the run that wrote the files now in
    metrics/models), best test bpb first; none before a study is published."""
    publisher = run_of_output(experiment, [paths.SUMMARIES])
    if publisher is None:
        return []
    return best_first(tracker().find_runs(experiment, f"tags.mlflow.parentRunId = '{publisher}'"))


def every_published(experiment: str) -> list[str]:
    """Every model any study has published so far, once: the newest row of each model's files (a model published
    again unchanged, by another study or after a bit-for-bit retrain, is one row), the newest VIEW_ROWS of them, best
    test bpb first."""
    seen, rows = set(), []
    for run in tracker().find_runs(experiment, f"tags.`{ROLE}` = '{PUBLISHED}'"):  # newest first
        key = (run.data.tags.get(MODEL), run.data.tags.get(MODEL_HASH))
        if key not in seen and len(rows) < VIEW_ROWS:
            seen.add(key)
            rows.append(run)
    return best_first(rows)


def made_by(run_ids: list[str]) -> list[str]:
    """The runs that made the models of the rows `run_ids`, in their order (a row whose model no run made left out)."""
    client = tracker().client
    return [made for r in run_ids if (made := client.get_run(r).data.tags.get(MADE_BY))]


def best_first(runs: list) -> list[str]:
    """The ids of `runs` (as a search returns them) by their SORT_METRIC, best first: MLflow's compare page shows runs
    in the order its link names them."""
    ranked = sorted(runs, key=lambda run: run.data.metrics.get(SORT_METRIC, float("inf")))
    return [run.info.run_id for run in ranked]


def leaderboard_state(run_ids: list[str], baseline_label: str) -> dict:
    """Just `run_ids` (published rows), best test bpb first, the labels as columns. Sorted by a metric, the UI lists
    them flat instead of folded under the publish run that holds them."""
    quoted = ", ".join(f"'{r}'" for r in run_ids)
    return {"searchFilter": f"attributes.run_id IN ({quoted})", "selectedColumns": columns(baseline_label),
            "orderByKey": column(SORT_METRIC), "orderByAsc": True}


def chart_state(run_ids: list[str], baseline_label: str) -> dict:
    """The leaderboard's runs in MLflow's chart mode, opened on one bar chart: their test bpb, best first (MLflow's
    own compare page opens on whichever metric its runs share first)."""
    section = "lmpipe-test-bpb"
    return {**leaderboard_state(run_ids, baseline_label),
            "compareRunCharts": [{"type": "BAR", "uuid": f"{section}-chart", "metricKey": SORT_METRIC, "deleted": False,
                                  "isGenerated": False, "displayName": "test bits per byte (mean over seeds)",
                                  "metricSectionId": section}],
            "compareRunSections": [{"uuid": section, "name": "Test bits per byte (lower is better)", "display": True,
                                    "isReordered": False}]}


def share(experiment: str, state: dict) -> str:
    """Save `state` as a shared view of the experiment; its key is the state's hash, so saving it again is a no-op."""
    text = json.dumps(state, sort_keys=True)
    store = tracker()
    key, experiment_key = hashlib.sha256(text.encode()).hexdigest()[:16], store.experiment_id(experiment)
    store.client.set_experiment_tag(experiment_key, SHARED_VIEW + key, text)
    return key


def view_url(base: str, experiment: str, key: str) -> str:
    """The runs page of the experiment's model-training workflow (not the GenAI one) opened on a shared view."""
    query = urllib.parse.urlencode({"workflowType": "machine_learning", "viewStateShareKey": key})
    return f"{base}/#/experiments/{tracker().experiment_id(experiment)}/runs?{query}"


def chart_url(base: str, experiment: str, key: str) -> str:
    """A shared view (`chart_state`) in the runs page's chart mode."""
    return view_url(base, experiment, key) + "&compareRunsMode=CHART"


def compare_url(base: str, experiment: str, run_ids: list[str]) -> str:
    """MLflow's compare view of `run_ids`: every param and metric side by side, the plots of their history."""
    query = urllib.parse.urlencode({"runs": json.dumps(run_ids, separators=(",", ":")),
                                    "experiments": json.dumps([tracker().experiment_id(experiment)])})
    return f"{base}/#/compare-runs?{query}"
