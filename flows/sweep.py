"""sweep flow: tune one model's settings on the current corpus and tokenizer, every trial an MLflow child run.

    lmpipe sweep --model gru --trials 40          (= python -m flows.sweep --model gru --trials 40)

    lmpipe sweep --model gru --space sweeps/equal_compute.yaml --seeds 0   (the study's equal tuning at its budget)

Reads params.yaml (the model's settings are the starting point), data/tokens and the search space in
sweeps/space.yaml (or --space). Writes, to commit: sweeps/<model>/ (sweeps/<space>/<model>/ for another space
file) trials.csv, best.yaml (a profile for `lmpipe profile`), seeds.csv (the winner retrained with other seeds),
trials.png, and docs/tuning.md over every sweep so far.
The Optuna study lives in .cache/lmpipe/sweeps/<model>.db: run the same command again and an interrupted
sweep continues; a changed space, budget, corpus or model starts a new study in the same file.
"""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import optuna
from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from flows._stage import PARAMS_FILE, main
from lmpipe import paths, sweep as sw
from lmpipe.tuning_doc import tuning_markdown
from lmpipe import tracking
from lmpipe.config import Params, load_params
from lmpipe.errors import ConfigError
from lmpipe.io import csv_text, write_text
from lmpipe.splits import TokenData, load_tokens
from lmpipe.train.job import Job, prepare, publish

SWEEPS_DIR, DOC = Path("sweeps"), Path("docs/tuning.md")
WORK = Path(paths.CACHE_DIR) / "sweeps"


def sweep_dir(space_file: str | Path, model: str) -> Path:
    """Where a sweep's outcome is committed: sweeps/<model>, or sweeps/<space>/<model> for another space file."""
    space_file = Path(space_file)
    return SWEEPS_DIR / model if space_file == Path(sw.SPACE_FILE) else SWEEPS_DIR / space_file.stem / model


def prepare_trial(params: Params, space: sw.Space, overrides: dict, data: TokenData, name: str, **train) -> Job:
    """A trial's run: the model's settings with the trial's overrides, at the sweep's budget and evaluations per
    epoch, checkpointed under the sweep's folder."""
    return prepare(params, space.model, WORK / name, overrides=overrides, budget=space.budget,
                   train={"evals_per_epoch": space.evals_per_epoch, **train}, data=data, params_file=PARAMS_FILE)


def train_trial(job: Job, run, on_eval=None) -> dict:
    """One training run at the trial budget, published to its MLflow run; its checkpoints go with it."""
    try:
        result = job.trainer.run(on_eval=on_eval)
        publish(run, result)
        return result.metrics
    finally:
        shutil.rmtree(job.ckpt_dir, ignore_errors=True)


def objective_for(model, space, params, data, experiment, parent_id, name):
    def objective(trial: optuna.Trial) -> float:
        overrides = sw.suggest(trial, space)
        job = prepare_trial(params, space, overrides, data, name)
        with tracking.runs.run(experiment, f"{model} trial {trial.number}", overrides, parent_run_id=parent_id,
                               tags={"lmpipe.role": "trial", "lmpipe.model": model, "lmpipe.sweep": name}) as run:
            evaluations = itertools.count(1)

            def on_eval(record):  # Hyperband's resource: evaluations so far
                tracking.log_evaluation(record, run.info.run_id)
                trial.report(record["valid_bpb"], next(evaluations))
                if trial.should_prune():
                    tracking.log_metrics({"pruned_at_tokens": record["tokens"]}, run_id=run.info.run_id)
                    raise optuna.TrialPruned()

            metrics = train_trial(job, run, on_eval)
            for key in ("evaluations", "tokens_seen", "train_flops", "seconds"):
                trial.set_user_attr(key, metrics[key])
        return metrics["valid_bpb"]
    return objective


@task(cache_policy=NO_CACHE)
def seed_runs(model, params, space, best, data, seeds, experiment, parent_id, name) -> list[dict]:
    """The winner retrained with `seeds` other seeds at the same budget: how much of its lead is luck."""
    rows = []
    for k in range(1, seeds + 1):
        seed = params.train.seed + k
        with tracking.runs.run(experiment, f"{model} best, seed {seed}", {"train.seed": seed},
                               parent_run_id=parent_id, tags={"lmpipe.role": "seed", "lmpipe.model": model}) as run:
            metrics = train_trial(prepare_trial(params, space, best, data, name, seed=seed), run)
        rows.append({"seed": seed, "valid_bpb": metrics["valid_bpb"], "valid_ppl": metrics["valid_ppl"],
                     "seconds": metrics["seconds"]})
    return rows


@flow(name="sweep", flow_run_name="sweep@{model}")
def sweep(model: str, trials: int = 20, seeds: int = 3, space_file: str = sw.SPACE_FILE) -> dict:
    params, data = load_params(PARAMS_FILE), load_tokens()
    if model not in params.models:
        raise ConfigError(f"{PARAMS_FILE}: models has no entry {model!r} (have: {', '.join(params.models)})")
    base, space = params.models[model], sw.load_space(space_file, model)
    name = sw.study_name(space, base, data.fingerprint, params.train.seed)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    out = sweep_dir(space_file, model)
    pruner = (optuna.pruners.HyperbandPruner(min_resource=1, reduction_factor=3) if space.prune
              else optuna.pruners.NopPruner())
    study = optuna.create_study(study_name=name, storage=sw.storage(WORK / f"{out.relative_to(SWEEPS_DIR)}.db"),
                                direction="minimize", pruner=pruner, load_if_exists=True)
    trials = min(trials, space.size) if space.grid else trials
    experiment = params.tracking.experiment
    with tracking.runs.run(experiment, f"sweep {model}",
                           {"trials": trials, "budget": space.budget, "space_file": space_file},
                           tags={"lmpipe.role": "sweep", "lmpipe.model": model, "lmpipe.sweep": name}) as parent:
        objective = objective_for(model, space, params, data, experiment, parent.info.run_id, name)
        out.mkdir(parents=True, exist_ok=True)

        def on_trial(t):  # the table so far, so an interrupted sweep's progress can be read (and committed)
            print(f"{model} trial {t.number}: {t.state.name.lower()}, valid bpb {t.value}", flush=True)
            write_text(out / "trials.csv", csv_text(sw.trials_table(study)))

        sw.run_sweep(study, trials, params.train.seed, objective, on_trial, grid=space.grid)
        best, rows = study.best_trial, sw.trials_table(study)
        write_text(out / "best.yaml", sw.profile_yaml(model, best, space, name, out))
        seed_rows = seed_runs(model, params, space, best.params, data, seeds, experiment,
                              parent.info.run_id, name) if seeds else []
        write_text(out / "seeds.csv", csv_text(seed_rows))
        sw.trials_figure(rows, model, out / "trials.png")
        write_text(DOC, tuning_markdown(SWEEPS_DIR))
        spread = sw.winner_spread([best.value] + [r["valid_bpb"] for r in seed_rows])
        tracking.log_metrics({"best_valid_bpb": best.value, "best_trial": best.number,
                              **{f"seed_{k}": v for k, v in spread.items()}})
        tracking.log_artifacts(out, out.as_posix())
    return {"study": name, "best": best.params, "valid_bpb": best.value, "seeds": spread}


if __name__ == "__main__":
    import click

    from lmpipe.sweep import sweep_options  # `lmpipe sweep`'s flags, defined once

    @click.command(help="Tune one model of params.yaml with Optuna (as lmpipe sweep).")
    @sweep_options
    def run(model: str, trials: int, seeds: int, space: str) -> None:
        main(sweep, model=model, trials=trials, seeds=seeds, space_file=space)

    run()
