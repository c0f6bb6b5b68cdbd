"""train@<model> stage: one neural LM from `models.<model>` in params.yaml.

Outputs: models/<model>/model.pt, metrics/train/<model>.json, plots/train/<model>.csv; the MLflow run that trained
the model is tagged with the folder's content hash (evaluate and audit find it from there).
Resumable checkpoints live in .cache/lmpipe/ckpt/<model>-<hash>/ (outside DVC's outputs, which DVC
deletes before a re-run), keyed by params, training code and the token data, so a change never resumes
a stale run. They are discarded only once every output is written (model, metrics, curve, MLflow run and
registry): a failure after training resumes the finished run without training again, and a stage that
succeeded leaves none, so `dvc repro -f` trains again from scratch.

Under torchrun (`torchrun --nproc-per-node N -m flows.train --model M`) the main process runs this
tracked flow and the others train alongside it untracked (DDP in lmpipe.train), then `dvc commit train@M`.
"""

import argparse
from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE

from flows import paths
from flows._stage import CACHE_DIR, PARAMS_FILE, main, stage_run
from lmpipe import checkpoints, distributed, tracking
from lmpipe.config import load_params
from lmpipe.io import atomic_path, csv_text, without_timings, write_json, write_text
from lmpipe.models import save_model
from lmpipe.splits import load_tokens
from lmpipe.train import Trainer, run_settings, setup_process

CKPT_ROOT = Path(CACHE_DIR) / "ckpt"
CURVE_COLUMNS = ("epoch", "tokens", "flops", "train_loss", "valid_bpb", "valid_ppl", "lr", "tokens_per_sec")


def progress_line(name: str, record: dict, epochs: float) -> str:
    """One persistent line per evaluation: where training is and how it goes."""
    minutes, seconds = divmod(int(record["elapsed_seconds"]), 60)
    return (f"{name} epoch {record['epoch']:.2f}/{epochs:g}  valid ppl {record['valid_ppl']:.1f}  "
            f"bpb {record['valid_bpb']:.4f}  {record['tokens_per_sec'] / 1000:.1f}k tok/s  {minutes}m{seconds:02d}s")


def artifact_key(model: str) -> str:
    """Prefect artifact keys take lowercase letters, digits and dashes; model names may hold underscores too."""
    return f"learning-curve-{model.replace('_', '-')}"


@task(cache_policy=NO_CACHE)  # its inputs (token streams) are not worth hashing; DVC decides what re-runs
def fit(name, settings, common, data, ckpt_dir, run_id):
    elapsed, logged = [], set()

    def on_eval(record):  # live learning curve in the model's MLflow run, and a line in the log
        tracking.log_evaluation(record, run_id)
        logged.add(record["step"])
        elapsed.append(record["train_seconds"])
        line = progress_line(name, {**record, "elapsed_seconds": sum(elapsed)}, trainer.total_steps / trainer.steps_per_epoch)
        logger.info(line)  # the console and the flow run's page in the Prefect UI

    logger = get_run_logger()
    trainer = Trainer(name, settings, common, data, ckpt_dir, setup_process(common, ckpt_dir), on_eval=on_eval)
    result = trainer.run()
    for record in result.history:  # points trained before a resume: the whole curve on this run too
        if record["step"] not in logged:
            tracking.log_evaluation(record, run_id)
    m = result.metrics
    create_table_artifact([{k: r[k] for k in CURVE_COLUMNS} for r in result.history], key=artifact_key(name),
                          description=f"{name}: validation at every evaluation (bits per byte, perplexity, speed)")
    logger.info(f"{name}: best valid bpb {m['valid_bpb']:.4f} (ppl {m['valid_ppl']:.1f}) at epoch {m['best_epoch']:g}; "
                f"{m['tokens_seen']:,} tokens, {m['train_flops']:.2e} FLOPs, {m['seconds']:.0f} s")
    return result


@flow(name="train", flow_run_name="train@{model}")
def train(model: str) -> dict:
    params, data = load_params(PARAMS_FILE), load_tokens()
    settings, chosen, ckpt_dir = run_settings(params, model, PARAMS_FILE, CKPT_ROOT, data)
    with stage_run(f"train@{model}", params, chosen, model=model) as run:
        result = fit(model, settings, params.train, data, ckpt_dir, run.info.run_id)
        with atomic_path(paths.model_dir(model)) as tmp:
            tmp.mkdir()
            save_model(result.model, settings.family, settings.arch, tmp / "model.pt")
        tracking.mark_output(paths.model_dir(model))
        write_json(paths.train_metrics(model), without_timings(result.metrics))  # timings: MLflow only
        write_text(paths.curve(model), csv_text([without_timings(r) for r in result.history]))
        tracking.log_metrics({k: v for k, v in result.metrics.items() if isinstance(v, (int, float))}
                             | {"train_tflops": result.metrics["train_flops"] / 1e12})  # FLOPs, readable in the UI
        tracking.log_compare_axes(model, result.metrics["n_params"], result.metrics["tokens_seen"])
        tracking.log_artifacts(paths.curve(model))
        tracking.registry.log_lm(paths.model_dir(model), paths.TOKENIZER, f"lmpipe-{model}",
                                 result.model.embed.num_embeddings)
        tracking.carry_results(params.tracking.experiment, paths.model_dir(model), run.info.run_id)
    checkpoints.discard(ckpt_dir)  # every output is written: only now may the training go
    return result.metrics


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="train one model of params.yaml's `models`")
    parser.add_argument("--model", required=True, nargs="+")  # DVC splits a name with a space: params.yaml's name
    model = " ".join(parser.parse_args().model)               # rule (main, first) then says what is wrong with it
    ranks = distributed.launched()
    if ranks.main:
        main(train, model=model)
    else:  # a torchrun helper process: same training, no outputs
        params, data = load_params(PARAMS_FILE), load_tokens()
        settings, _, ckpt_dir = run_settings(params, model, PARAMS_FILE, CKPT_ROOT, data)
        Trainer(model, settings, params.train, data, ckpt_dir, setup_process(params.train, ckpt_dir)).run()
    distributed.leave(ranks)
