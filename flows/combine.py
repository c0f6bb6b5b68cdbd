"""combine stage: the study's models linearly interpolated per token (lmpipe/combine.py), weights fitted on valid;
all of them also with a unigram cache (its window the best on valid of `combine.cache_windows`).

Reads the per-token log-probabilities each `score@<model>` and `score_ngram` saved (data/logprobs/<model>.npz), so
no model runs again, and writes metrics/combine.json:
{"models": {"gru+ngram": {"weights": {...}, "valid": {...}, "test": {...}}, ...}}.
"""

import numpy as np
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_table_artifact

from lmpipe import paths
from flows._stage import PARAMS_FILE, drop_removed, main, score_stage, stage_run
from lmpipe import tracking
from lmpipe.paths import BASELINE
from lmpipe.combine import combinations
from lmpipe.config import load_params
from lmpipe.errors import LmpipeError
from lmpipe.io import write_json
from lmpipe.splits import load_tokens


def read_logprobs(names: list[str]) -> dict:
    found = {}
    for name in names:
        try:
            with np.load(paths.logprobs(name)) as saved:
                found[name] = {split: saved[split] for split in ("valid", "test")}
        except (OSError, KeyError):
            raise LmpipeError(f"{paths.logprobs(name)}: no per-token log-probabilities of {name} (run: dvc repro "
                              f"{score_stage(name)})") from None
    return found


def metric_name(combination: str) -> str:
    """MLflow metric names take no '+': 'gru+ngram' is logged as 'gru:ngram'."""
    return combination.replace("+", ":")


@task
def fit_combinations(names: list[str], cache_windows: list[int]) -> dict:
    logprobs, data = read_logprobs(names), load_tokens()
    rows = combinations(logprobs, data.splits, cache_windows=cache_windows, vocab_size=data.vocab_size)
    for name, row in rows.items():
        weights = ", ".join(f"{m} {w:.2f}" for m, w in row["weights"].items())
        get_run_logger().info(f"{name}: test bpb {row['test']['bpb']:.4f} (weights {weights})")
    return rows


@flow(name="combine")
def combine() -> dict:
    params = load_params(PARAMS_FILE)
    drop_removed(list(params.models))  # a removed model's log-probabilities, before DVC hashes data/logprobs/
    with stage_run("combine", params, []):
        rows = fit_combinations([BASELINE, *params.models], params.combine.cache_windows)
        write_json(paths.COMBINE, {"models": rows})
        create_table_artifact([{"combination": name, "test_bpb": r["test"]["bpb"], "test_word_ppl": r["test"]["word_ppl"],
                                **{f"w_{m}": w for m, w in r["weights"].items()}} for name, r in rows.items()],
                              key="combinations", description="models interpolated per token, weights fitted on valid")
        tracking.log_metrics({f"{metric_name(name)}.{split}_{key}": r[split][key] for name, r in rows.items()
                              for split in ("valid", "test") for key in ("bpb", "word_ppl")})
        tracking.log_artifacts(paths.COMBINE)
    return rows


if __name__ == "__main__":
    main(combine)
