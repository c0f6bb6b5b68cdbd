"""evaluate stage: one perplexity table for every model (n-gram included) and decoding samples.

Outputs metrics/eval.json, reports/samples.md, plots/eval/perplexity.csv, and each model's per-token
log-probabilities on valid and test (data/logprobs/<model>.npz, float32), which `combine` mixes; each model's MLflow run
(found by the content hash of models/<model>, tracking.run_of_output) gets its test_* metrics, so the MLflow UI compares all.
"""

import csv
import io
import time

import numpy as np
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_table_artifact
from tokenizers import Tokenizer

from flows import paths
from flows._stage import PARAMS_FILE, drop_removed, main, stage_run
from lmpipe import tracking
from lmpipe.config import load_params
from lmpipe.evaluate import evaluate_lm, load_lm
from lmpipe.io import atomic_path, write_json, write_text
from lmpipe.samples import sample_all, samples_markdown, strategy_table
from lmpipe.splits import load_tokens

METRICS, SAMPLES, PLOT = paths.EVAL, paths.SAMPLES, paths.PERPLEXITY_PLOT


def model_names(params) -> list[str]:
    return ["ngram", *params.models]


@task
def score_and_sample(names: list[str], params) -> tuple[dict, dict]:
    """Perplexities and decoding samples, loading the token streams and every model once."""
    logger, data = get_run_logger(), load_tokens()
    models = {name: load_lm(paths.model_dir(name)) for name in names}
    results, logprobs = {}, {}
    for name, model in models.items():  # a line per model: scoring every split takes a while
        started = time.perf_counter()
        logprobs[name] = {}
        results[name] = evaluate_lm(model, data, params.chunk, token_logprobs=logprobs[name])
        test = results[name]["test"]
        logger.info(f"{name}: test bpb {test['bpb']:.4f}, word ppl {test['word_ppl']:,.0f} "
                    f"({time.perf_counter() - started:.0f} s)")
    logger.info(f"decoding: {len(params.strategies)} strategies x {len(params.prompts)} prompts x {len(models)} models")
    samples = sample_all(models, Tokenizer.from_file(paths.TOKENIZER), data.boundary, params)
    return results, samples, logprobs


def write_logprobs(logprobs: dict) -> None:
    """One .npz per model, the folder replaced as a whole (a removed model's file goes with it)."""
    with atomic_path(paths.LOGPROBS) as tmp:
        tmp.mkdir()
        for name, splits in logprobs.items():
            np.savez(tmp / f"{name}.npz", **splits)


def perplexity_csv(results: dict) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["model", "test_ppl", "test_word_ppl", "test_bpb", "valid_ppl"])
    for name, r in sorted(results.items(), key=lambda kv: kv[1]["test"]["word_ppl"]):
        writer.writerow([name, r["test"]["ppl"], r["test"]["word_ppl"], r["test"]["bpb"], r["valid"]["ppl"]])
    return out.getvalue()


@flow(name="evaluate")
def evaluate() -> dict:
    params = load_params(PARAMS_FILE)
    names = model_names(params)
    drop_removed(list(params.models))  # a removed model's outputs, before DVC hashes models/
    with stage_run("evaluate", params, ["evaluate"]):
        results, samples, logprobs = score_and_sample(names, params.evaluate)
        write_logprobs(logprobs)
        write_json(METRICS, {"models": results, "decoding": strategy_table(samples)})
        write_text(SAMPLES, samples_markdown(samples, params.evaluate))
        write_text(PLOT, perplexity_csv(results))
        create_table_artifact([{"model": name, **{f"test_{k}": r["test"][k] for k in ("bpb", "word_ppl", "ppl")}}
                               for name, r in sorted(results.items(), key=lambda kv: kv[1]["test"]["bpb"])],
                              key="test-perplexity", description="every model on the test split, best first")
        for name, r in results.items():
            tracking.log_metrics({f"{name}.{split}_{key}": r[split][key] for split in ("valid", "test") for key in r[split]})
            run_id = tracking.run_of_output(params.tracking.experiment, paths.model_dir(name))
            if run_id:  # the model's own run carries its test numbers too
                tracking.log_metrics({f"test_{k}": v for k, v in r["test"].items()} | {"n_params": r["n_params"]},
                                     run_id=run_id)
        tracking.log_artifacts(METRICS)
        tracking.log_artifacts(SAMPLES)
    return results


if __name__ == "__main__":
    main(evaluate)
