"""scaling pipeline (scaling/dvc.yaml), apart from the default study: the grid of runs (the fits: flows.scaling_fit).

    lmpipe scaling          (the grid: frozen in DVC, so `dvc repro` never trains it; lmpipe scaling commits it)

grid: every size in params.yaml's `scaling.models` at every budget in `scaling.budgets` (and at each budget of
`scaling.around_best`, past those, the sizes it lists around each family's best), less the runs that would
read the training tokens more than lmpipe.scaling.MAX_EPOCHS times, trained by the library's Trainer on the default
pipeline's data/tokens until its FLOP budget is spent; one MLflow child run each under one `scaling` run. Writes
scaling/runs.csv. A finished run's row is kept in .cache/lmpipe/scaling/runs/, keyed by everything that decides it,
and a killed run resumes from its checkpoint: an interrupted grid continues where it stopped (in the same MLflow
run), and a changed budget list retrains only the new points. The runs are independent: with `orchestration.task_runner`
dask (or ray) they train side by side on its workers (flows.runners.run_apart; docs/scale-out.md), at most
lmpipe.checkpoints.KEEP of one family at a time; a failed run stops no other, and the rows keep the grid's order.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from flows._stage import PARAMS_FILE, check_declared, main
from flows.runners import in_project, orchestration_with, results, run_apart
from lmpipe.paths import CACHE_DIR, GRID_MADE_WITH, RUNS, SCALING_PIPELINE
from lmpipe import tracking
from lmpipe.config import Params, load_params, params_hash
from lmpipe.errors import ConfigError
from lmpipe.io import csv_text, write_json, write_text
from lmpipe.flops import ANALYTIC, train_flops_per_token
from lmpipe.models import arch_with_defaults
from lmpipe.grid_record import grid_settings, made_with
from lmpipe.scaling import MAX_EPOCHS, GridPoint, grid_points, size_label
from lmpipe.splits import TokenData, load_tokens
from lmpipe.checkpoints import KEEP, code_version
from lmpipe.train.job import Job, prepare, publish
from lmpipe.train.trainer import TrainResult

WORK = Path(CACHE_DIR) / "scaling"
ROWS = WORK / "runs"  # each finished point's row (Job.cached), kept under its key
COLUMNS = ("name", "model", "family", "size", "budget", "n_params", "n_params_non_embedding", "tokens", "flops",
           "epochs", "epoch_tokens", "valid_bpb", "valid_ppl", "valid_loss", "device")  # scaling/runs.csv, in order


def prepare_point(point: GridPoint, params: Params, data: TokenData) -> Job:
    """The family's settings with the grid's overrides, this size's arch and this budget; the train section with
    the grid's evaluations per epoch and precision (and the point's seed, where it has one)."""
    overrides = {**params.scaling.overrides, **{f"arch.{k}": v for k, v in point.size.items()}}
    try:
        return prepare(params, point.model, WORK / "ckpt", overrides=overrides, budget={"flops": point.budget},
                       train={"evals_per_epoch": params.scaling.evals_per_epoch,
                              "precision": params.scaling.precision,
                              **({} if point.seed is None else {"seed": point.seed})},
                       data=data, params_file=PARAMS_FILE)
    except ConfigError as exc:
        raise ConfigError(f"{PARAMS_FILE}: scaling, {point.name}: {exc}") from None


def planned_epochs(settings, budget: float, vocab_size: int, epoch_tokens: int) -> float | None:
    """How many times a run of `settings` (a family's ModelParams, with a grid size's arch) reads the training
    tokens to spend `budget` FLOPs; None for a family lmpipe.flops has no formula for (it counts its parameters)."""
    if settings.family not in ANALYTIC:
        return None
    arch = arch_with_defaults(settings.family, settings.arch)
    return budget / train_flops_per_token(settings.family, arch, vocab_size, settings.seq_len) / epoch_tokens


def plan(params: Params, data: TokenData) -> tuple[list[GridPoint], list[Job]]:
    """The grid's points and their jobs, every one prepared (so every typo shows before the first hour of training),
    less the runs that would read the training tokens more than MAX_EPOCHS times, each named as it is left out."""
    points, jobs = [], []
    seeds = params.scaling.seeds
    around_best = [(a.budget, a.models) for a in params.scaling.around_best]
    for point in grid_points(params.scaling.models, params.scaling.budgets, seeds.extra, seeds.budgets, around_best):
        job = prepare_point(point, params, data)
        epochs = planned_epochs(job.settings, point.budget, data.vocab_size, len(data.splits["train"].tokens))
        if epochs is not None and epochs > MAX_EPOCHS:
            print(f"{point.name}: left out, it would read the training tokens {epochs:.1f} times "
                  f"(more than {MAX_EPOCHS}: lmpipe.scaling.MAX_EPOCHS)", flush=True)
            continue
        points.append(point)
        jobs.append(job)
    return points, jobs


def precision_key(job: Job) -> dict:
    """The precision a grid run trains in on this machine (`precision: auto` is bf16 where the CPU multiplies bf16
    natively, else fp32), part of its key so that a grid resumed on another machine never mixes in rows of the other
    precision; fp32 runs keep the key they had before the precision was part of it."""
    return {} if job.trainer.autocast is None else {"precision": "bf16"}


def row_key(job: Job) -> str:
    """The key a grid run's row is cached under: what decides the run, and its training precision."""
    return job.key(**precision_key(job))


@task(cache_policy=NO_CACHE, task_run_name="{point.name}")
def train_point(point: GridPoint, job: Job, params: Params, parent_id: str, cwd: str | None = None) -> dict:
    """One run of the grid, or its row from an earlier, identical run (`Job.cached`): the same settings, code, data
    and training precision. `cwd`: the project, where a worker of a cluster runs it (flows.runners.in_project)."""
    with in_project(cwd):
        return _train_point(point, job, params, parent_id)


def _train_point(point: GridPoint, job: Job, params: Params, parent_id: str) -> dict:
    settings = job.settings
    key = row_key(job)
    tags = {"lmpipe.role": "scaling-run", "lmpipe.model": point.model, "lmpipe.point": key}

    def reused(row: dict) -> None:  # a child run here too when this scaling run lacks one
        row.setdefault("valid_loss", math.log(row["valid_ppl"]))  # rows cached before the column existed
        if not tracking.runs.find_runs(params.tracking.experiment,
                                       {"lmpipe.point": key, "mlflow.parentRunId": parent_id}):
            with tracking.runs.run(params.tracking.experiment, point.name, settings.model_dump(mode="json"),
                                   parent_run_id=parent_id,
                                   tags={**tags, "lmpipe.reused": "a finished run of an earlier grid"}):
                tracking.log_metrics({k: v for k, v in row.items() if k not in ("budget",)})
        print(f"{point.name}: valid bpb {row['valid_bpb']:.4f} (trained before, reused)", flush=True)

    def train() -> dict:
        with tracking.runs.run(params.tracking.experiment, point.name, settings.model_dump(mode="json"),
                               parent_run_id=parent_id, tags=tags) as run:
            row, result = trained_row(point, job, lambda record: tracking.log_evaluation(record, run.info.run_id))
            publish(run, result)
        print(f"{point.name}: valid bpb {row['valid_bpb']:.4f}, N {row['n_params']:,}, D {row['tokens']:,} tokens, "
              f"{row['wall_seconds']:.0f} s", flush=True)
        return row

    return job.cached(ROWS, point.name, key, train, reused)


def trained_row(point: GridPoint, job: Job, on_eval=None) -> tuple[dict, TrainResult]:
    """The point trained to its budget (`on_eval` told each evaluation): its row (scaling/runs.csv's columns, its
    seconds and its precision, as the row cache keeps it) and the run's result."""
    started = time.perf_counter()
    result = job.trainer.run(on_eval=on_eval)
    m = result.metrics
    return {"name": point.name, "model": point.model, "family": job.settings.family, "size": size_label(point.size),
            "budget": point.budget, "n_params": m["n_params"], "n_params_non_embedding": m["n_params_non_embedding"],
            "tokens": m["tokens_seen"], "flops": m["train_flops"], "epochs": m["epochs"],
            "epoch_tokens": len(job.data.splits["train"].tokens), "valid_bpb": m["valid_bpb"],
            "valid_ppl": m["valid_ppl"], "valid_loss": math.log(m["valid_ppl"]), "train_seconds": m["seconds"],
            "wall_seconds": time.perf_counter() - started, "flops_per_sec": m["flops_per_sec"],
            "device": m["device"], "precision": m["precision"]}, result


def train_points(points: list[GridPoint], jobs: list[Job], params: Params, parent_id: str) -> list[dict]:
    """Every point's row, in the grid's order, each trained (or read from the cache) on the task runner of
    `orchestration`: side by side on its workers, at most KEEP runs of one family at a time, as a family keeps only
    its newest KEEP unfinished runs' checkpoints (an older one is deleted when a run of it starts). A failed run is
    named after the others have finished (their rows cached, so a rerun trains only what failed)."""
    outcomes = run_apart(train_point, [{"point": p, "job": job, "params": params, "parent_id": parent_id}
                                       for p, job in zip(points, jobs)],
                         [p.model for p in points], params.orchestration, per_group=KEEP, name="scaling-grid-runs")
    return results([p.name for p in points], outcomes, "grid runs")


def grid_run(params: Params, data: TokenData):
    """The grid's MLflow run, resumed by what decides the grid (an interrupted grid continues in the same run)."""
    key = params_hash({"scaling": grid_settings(params), "train": params.section("train"),
                       "models": {m: params.models[m].model_dump(mode="json") for m in params.scaling.models},
                       "code": code_version(), "data": data.fingerprint})
    return tracking.runs.run(params.tracking.experiment, f"scaling {key[:8]}", {"scaling": params.section("scaling")},
                             tags={"lmpipe.role": "scaling"}, resume={"lmpipe.scaling": key})


@flow(name="scaling-grid")
def grid(workers: int | None = None, address: str | None = None) -> str:
    """The grid, its runs spread as params.yaml's `orchestration` says, or as `workers`/`address` do
    (flows.runners.spread_options)."""
    params, data = load_params(PARAMS_FILE), load_tokens()
    params = params.model_copy(update={"orchestration": orchestration_with(params.orchestration, workers, address)})
    if not params.scaling.models or not params.scaling.budgets:
        raise ConfigError(f"{PARAMS_FILE}: scaling.models and scaling.budgets must list at least one model and budget")
    check_declared(list(params.scaling.models), SCALING_PIPELINE, "grid")
    points, jobs = plan(params, data)
    with grid_run(params, data) as parent:
        rows = train_points(points, jobs, params, parent.info.run_id)
        write_text(RUNS, csv_text([{c: r[c] for c in COLUMNS} for r in rows]))  # timings: MLflow and the cache only
        write_json(GRID_MADE_WITH, made_with(params, data))
        tracking.log_metrics({"runs": len(rows), "grid_seconds": sum(r["wall_seconds"] for r in rows)})
        tracking.log_artifacts(RUNS)
        tracking.mark_output(RUNS)
    return str(RUNS)


if __name__ == "__main__":
    import click

    from flows.runners import spread_options

    @click.command(help="Train the scaling grid (lmpipe scaling runs this, commits it, then fits it).")
    @spread_options
    def run(workers: int | None, address: str | None) -> None:
        main(grid, workers=workers, address=address)

    run()
