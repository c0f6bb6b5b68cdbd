"""score@<model> and score_ngram stages: one model's perplexities and decoding samples.

Outputs metrics/eval/<model>.json ({"valid", "test", "n_params", "decoding": {strategy: samples and their numbers}})
and data/logprobs/<model>.npz (each token's log-probability on valid and test, float32: what `combine` mixes). The
model's own MLflow run (found by the content hash of models/<model>, tracking.run_of_output) gets its test_* metrics.
A neural model is registered here, as `lmpipe-<model>` with the decoding settings of `evaluate` (what its
samples used; its card's numbers are the publish stage's): a changed decoding setting re-runs this stage and
registers a new version, never retraining. One stage per model, as training is, so adding a model scores only that
model; `evaluate` joins the files.
"""

import argparse
import time

import numpy as np
from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from tokenizers import Tokenizer

from lmpipe import paths
from flows._stage import PARAMS_FILE, main, score_stage, stage_run
from lmpipe import tracking
from lmpipe.paths import BASELINE
from lmpipe.config import load_params
from lmpipe.decode import DecodeSettings
from lmpipe.evaluate import evaluate_lm
from lmpipe.trained import load_lm
from lmpipe.io import atomic_path, write_json
from lmpipe.samples import sample_all
from lmpipe.splits import load_tokens


@task(cache_policy=NO_CACHE)
def score_and_sample(name: str, params, data) -> tuple[dict, dict, dict]:
    """(perplexities, decoding samples, per-token log-probabilities) of one model."""
    logger, model = get_run_logger(), load_lm(paths.model_dir(name))
    started, logprobs = time.perf_counter(), {}
    scores = evaluate_lm(model, data, params.chunk, token_logprobs=logprobs)
    logger.info(f"{name}: test bpb {scores['test']['bpb']:.4f}, word ppl {scores['test']['word_ppl']:,.0f} "
                f"({time.perf_counter() - started:.0f} s)")
    logger.info(f"{name}: decoding {len(params.strategies)} strategies x {len(params.prompts)} prompts")
    samples = sample_all({name: model}, Tokenizer.from_file(paths.TOKENIZER), data.boundary, params)[name]
    return scores, samples, logprobs


@flow(name="score")
def score(model: str) -> dict:
    params, data = load_params(PARAMS_FILE), load_tokens()
    with stage_run(score_stage(model), params, ["evaluate"], model=model):
        scores, samples, logprobs = score_and_sample(model, params.evaluate, data)
        with atomic_path(paths.logprobs(model)) as tmp:
            with tmp.open("wb") as out:  # np.savez would add .npz to a name without it
                np.savez(out, **logprobs)
        write_json(paths.eval_metrics(model), {**scores, "decoding": samples})
        tracking.log_metrics({f"{split}_{key}": scores[split][key] for split in ("valid", "test")
                              for key in scores[split]})
        run_id = tracking.run_of_output(params.tracking.experiment, paths.model_dir(model))
        if run_id:  # the model's own run carries its test numbers too (its size it logged itself)
            tracking.record_results(run_id, scores["test"])
        if model != BASELINE:
            tracking.registry.log_lm(paths.model_dir(model), paths.TOKENIZER, tracking.registry.registered_name(model),
                                     data.vocab_size, DecodeSettings.from_params(params.evaluate))
    return scores


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="score one model: perplexities, samples, per-token log-probs")
    parser.add_argument("--model", required=True, help="an entry of params.yaml's models, or ngram")
    model = parser.parse_args().model
    main(score.with_options(flow_run_name=score_stage(model)), model=model)
