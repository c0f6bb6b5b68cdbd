"""train@<model> stage: one neural LM from `models.<model>` in params.yaml.

Outputs: models/<model>/model.pt, metrics/train/<model>.json, plots/train/<model>.csv; the MLflow run that trained
the model is tagged with the folder's content hash (score, evaluate and audit find it from there; score@<model>
registers the model, with the decoding settings of params.yaml's `evaluate`).
Resumable checkpoints live in .cache/lmpipe/ckpt/<model>-<hash>/ (outside DVC's outputs, which DVC
deletes before a re-run), keyed by params, training code and the token data, so a change never resumes
a stale run. They are discarded only once every output is written (model, metrics, curve and MLflow run): a failure after training resumes the finished run without training again, and a stage that
succeeded leaves none, so `dvc repro -f` trains again from scratch.

Under torchrun (`torchrun --nproc-per-node N -m flows.train --model M`) the main process runs this
tracked flow and the others train alongside it untracked (DDP in lmpipe.train), then `dvc commit train@M`.
"""

import argparse
import time
from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE

from lmpipe import paths
from flows._stage import PARAMS_FILE, main, stage_run
from lmpipe import checkpoints, distributed, tracking
from lmpipe.config import Params, load_params
from lmpipe.evaluate import evaluate_lm
from lmpipe.machine import machine
from lmpipe.train import pick_device
from lmpipe.train.job import Job, Outputs, prepare, publish
from lmpipe.train.trainer import TrainResult

CKPT_ROOT = Path(paths.CACHE_DIR) / "ckpt"
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
def fit(job: Job, run_id: str, branches: list[Job] = ()):
    """The training loop, its curve live in the model's MLflow run and a line per evaluation in the log; it saves
    each branch's state at the branch's decay start."""
    elapsed, logged, logger, trainer = [], set(), get_run_logger(), job.trainer

    def on_eval(record):
        tracking.log_evaluation(record, run_id)
        logged.add(record["step"])
        elapsed.append(record["train_seconds"])
        line = progress_line(job.name, {**record, "elapsed_seconds": sum(elapsed)},
                             trainer.total_steps / trainer.steps_per_epoch)
        logger.info(line)  # the console and the flow run's page in the Prefect UI

    started = time.perf_counter()
    result = job.run(on_eval=on_eval, branches=branches)
    tracking.log_metrics({"fit_seconds": time.perf_counter() - started}, run_id=run_id)  # wall time, evaluations in
    for record in result.history:  # points trained before a resume: the whole curve on this run too
        if record["step"] not in logged:
            tracking.log_evaluation(record, run_id)
    m = result.metrics
    create_table_artifact([{k: r[k] for k in CURVE_COLUMNS} for r in result.history], key=artifact_key(job.name),
                          description=f"{job.name}: validation at every evaluation (bits per byte, perplexity, speed)")
    logger.info(f"{job.name}: best valid bpb {m['valid_bpb']:.4f} (ppl {m['valid_ppl']:.1f}) at epoch "
                f"{m['best_epoch']:g}; {m['tokens_seen']:,} tokens, {m['train_flops']:.2e} FLOPs, {m['seconds']:.0f} s")
    return result


@task(cache_policy=NO_CACHE)
def anneal(job: Job, result: TrainResult, branches: list[Job], run_id: str) -> list[dict]:
    """Each branch's decay from the state the run saved for it (validated at its end only), then every budget's
    annealed model scored: a record (budget, FLOPs, valid and test bpb) per budget, the run itself last. Test as the
    score stage scores it (valid: the run's own last evaluation). Logs the branches' cost two ways:
    `branch_train_seconds`, their decays' training steps (beside the run's `seconds`), and `branch_seconds`, wall
    time with their validation and test passes."""
    logger, records, decays, steps = get_run_logger(), [], 0.0, 0.0
    for branch, budget in [*((b, b.settings.budget.flops) for b in branches), (None, job.settings.budget.flops)]:
        started = time.perf_counter()
        done = branch.trainer.run(curve=False) if branch is not None else result  # its last point is its result
        took = time.perf_counter() - started
        test = evaluate_lm(done.model.eval(), job.data, job.common.eval_chunk, splits=("test",))["test"]
        if branch is not None:  # its test pass in
            decays += time.perf_counter() - started
            steps += done.metrics["seconds"] - branch.trainer.progress.branched_seconds
        records.append({"budget_flops": budget, "train_flops": done.metrics["train_flops"],
                        "tokens_seen": done.metrics["tokens_seen"], "valid_bpb": done.metrics["valid_bpb"],
                        "test_bpb": test["bpb"]})
        trained = f"; its decay took {took:.0f} s" if branch is not None else ""
        logger.info(f"{job.name} annealed at {budget:.2e} FLOPs: valid bpb {done.metrics['valid_bpb']:.4f}, "
                    f"test bpb {test['bpb']:.4f}{trained}")
        step = int(budget / 1e9)  # GFLOPs: the MLflow chart's x axis
        tracking.log_metrics({"annealed_valid_bpb": records[-1]["valid_bpb"],
                              "annealed_test_bpb": records[-1]["test_bpb"]}, run_id=run_id, step=step)
    tracking.log_metrics({"branch_seconds": decays, "branch_train_seconds": steps}, run_id=run_id)
    return records


def study_branches(params: Params, job: Job) -> list[Job]:
    """The decay branches of `study.branches` for a run on the study's budget (a model with a budget of its own, or
    epochs, has none)."""
    return [job.branch(flops) for flops in params.branches_of(job.settings)]


def branch_budgets(branches: list[Job]) -> dict:
    """The decay branches a run gives (none: nothing), part of what decides its reported numbers."""
    return {"branches": [b.settings.budget.flops for b in branches]} if branches else {}


def made_by(job: Job, branches: list[Job]) -> dict:
    """Its identity (the code, the params but the seed, the data: `Job.identity`) and the machine it ran on,
    provenance: a study's seed rows hold while its training has their identity (lmpipe.seeds)."""
    return {"identity": job.identity(**branch_budgets(branches)), "machine": machine(pick_device(job.common.device))}


@flow(name="train", flow_run_name="train@{model}")
def train(model: str) -> dict:
    params = load_params(PARAMS_FILE)
    job = prepare(params, model, CKPT_ROOT, params_file=PARAMS_FILE)
    branches = study_branches(params, job)
    outputs = Outputs(paths.model_dir(model), paths.train_metrics(model), paths.curve(model))
    with stage_run(f"train@{model}", params, job.chosen, model=model) as run:
        result = fit(job, run.info.run_id, branches)
        if branches:
            result.metrics["budgets"] = anneal(job, result, branches, run.info.run_id)
        result.metrics.update(made_by(job, branches))
        publish(run, result, outputs)
    for done in [job, *branches]:  # every output is written: only now may the training go
        checkpoints.discard(done.ckpt_dir)
    return result.metrics


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="train one model of params.yaml's `models`")
    parser.add_argument("--model", required=True, nargs="+")  # DVC splits a name with a space: params.yaml's name
    model = " ".join(parser.parse_args().model)               # rule (main, first) then says what is wrong with it
    ranks = distributed.launched()
    if ranks.main:
        main(train, model=model)
    else:  # a torchrun helper process: same training, no outputs
        prepare(load_params(PARAMS_FILE), model, CKPT_ROOT, params_file=PARAMS_FILE).trainer.run()
    distributed.leave(ranks)
