"""evaluate stage: the per-model scores joined into one perplexity table (n-gram included) and the samples page.

Reads metrics/eval/<model>.json of the n-gram and of every entry of `models` (score_ngram, score@<model>) and writes
metrics/eval.json, reports/samples.md and plots/eval/perplexity.csv; its MLflow run holds every model's numbers, so
the UI compares them in one run. No model runs here: adding a model costs its own scoring and this join.
"""

import json
from pathlib import Path

from prefect import flow
from prefect.artifacts import create_table_artifact

from lmpipe import paths
from flows._stage import PARAMS_FILE, drop_removed, main, score_stage, stage_run
from lmpipe import tracking
from lmpipe.paths import BASELINE
from lmpipe.config import load_params
from lmpipe.errors import LmpipeError
from lmpipe.io import csv_text, write_json, write_text
from lmpipe.samples import samples_markdown, strategy_table

METRICS, SAMPLES, PLOT = paths.EVAL, paths.SAMPLES, paths.PERPLEXITY_PLOT


def model_names(params) -> list[str]:
    return [BASELINE, *params.models]


def read_scores(names: list[str], strategies: list[str]) -> tuple[dict, dict]:
    """({model: valid, test, n_params}, {model: decoding samples, in params.yaml's order of strategies}) from each
    model's score file."""
    results, samples = {}, {}
    for name in names:
        try:
            scored = json.loads(Path(paths.eval_metrics(name)).read_text())
            decoding = scored.pop("decoding")
            samples[name] = {strategy: decoding[strategy] for strategy in strategies}
        except (OSError, ValueError, KeyError):
            raise LmpipeError(f"{paths.eval_metrics(name)}: no scores of {name} under params.yaml's `evaluate` "
                              f"(run: dvc repro {score_stage(name)})") from None
        results[name] = scored
    return results, samples


def perplexity_csv(results: dict) -> str:
    """plots/eval/perplexity.csv: a row per model, lowest test word perplexity first."""
    return csv_text([{"model": name, "test_ppl": r["test"]["ppl"], "test_word_ppl": r["test"]["word_ppl"],
                      "test_bpb": r["test"]["bpb"], "valid_ppl": r["valid"]["ppl"]}
                     for name, r in sorted(results.items(), key=lambda kv: kv[1]["test"]["word_ppl"])],
                    ("model", "test_ppl", "test_word_ppl", "test_bpb", "valid_ppl"))


@flow(name="evaluate")
def evaluate() -> dict:
    params = load_params(PARAMS_FILE)
    drop_removed(list(params.models))  # a removed model's outputs, before DVC hashes models/ and metrics/eval/
    with stage_run("evaluate", params, ["evaluate"]):
        results, samples = read_scores(model_names(params), params.evaluate.strategies)
        write_json(METRICS, {"models": results, "decoding": strategy_table(samples)})
        write_text(SAMPLES, samples_markdown(samples, params.evaluate))
        write_text(PLOT, perplexity_csv(results))
        create_table_artifact([{"model": name, **{f"test_{k}": r["test"][k] for k in ("bpb", "word_ppl", "ppl")}}
                               for name, r in sorted(results.items(), key=lambda kv: kv[1]["test"]["bpb"])],
                              key="test-perplexity", description="every model on the test split, best first")
        for name, r in results.items():
            tracking.log_metrics({f"{name}.{split}_{key}": r[split][key] for split in ("valid", "test") for key in r[split]})
        tracking.log_artifacts(METRICS)
        tracking.log_artifacts(SAMPLES)
    return results


if __name__ == "__main__":
    main(evaluate)
