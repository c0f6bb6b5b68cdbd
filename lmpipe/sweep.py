"""Hyperparameter sweeps: Optuna (seeded TPE, Hyperband pruning) drives the project's own Trainer.

A search space is a YAML file (`sweeps/space.yaml`), one entry per model of params.yaml:

    gru:
      budget: {flops: 2.0e13}            # every trial trains for exactly this much compute
      space:
        optim.lr: {low: 1.0e-3, high: 1.0e-2, log: true}     # float (log scale)
        arch.dropout: {low: 0.0, high: 0.4}                   # float
        arch.layers: {low: 1, high: 3}                        # int (both bounds whole numbers)
        batch_size: {choices: [16, 32, 64]}                   # categorical
      prune: true                        # Hyperband stops trailing trials (false: every trial runs its budget)

A space whose every setting is a list of choices is searched as a grid (every point once, in a seeded order):
that is how every family gets the same learning-rate sweep at the study's budget (sweeps/equal_compute.yaml).
Keys are dotted paths into `models.<model>`; everything not searched keeps its params.yaml value.
Trials are bounded by tokens or FLOPs, never by seconds, so a sweep is reproducible: each trial's
sampler is seeded from (seed, trial number) and training is deterministic on CPU, so the same space,
budget, data and seed give the same trials, also after an interrupted sweep resumes from its SQLite
study. Each trial reports its validation bpb at every evaluation; Hyperband stops the poor ones early.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import click
import yaml

from lmpipe import stats
from lmpipe.config import params_hash, yaml_error_place
from lmpipe.model_params import ModelParams
from lmpipe.errors import ConfigError
from lmpipe.overrides import nested

SPACE_FILE = "sweeps/space.yaml"
RANDOM_TRIALS = 6  # TPE samples at random until this many trials exist (fixed, so a longer sweep extends a shorter one)



def sweep_options(function):
    """The flags of `lmpipe sweep` (and of `python -m flows.sweep`, which it runs)."""
    for name, kwargs in reversed({
            "--model": {"required": True, "help": "an entry of params.yaml's `models`"},
            "--trials": {"type": click.IntRange(min=1), "default": 20,
                         "help": "finished trials the sweep should hold (it resumes)"},
            "--seeds": {"type": click.IntRange(min=0), "default": 3,
                        "help": "retrain the winner with this many other seeds"},
            "--space": {"default": SPACE_FILE, "metavar": "FILE", "help": "a YAML file of search spaces, one per model"},
    }.items()):
        function = click.option(name, **kwargs)(function)
    return function

@dataclass(frozen=True)
class Space:
    model: str
    budget: dict  # {"tokens": N} or {"flops": F}
    params: dict  # dotted key -> {low, high[, log]} | {choices}
    evals_per_epoch: int = 4  # validation points per epoch: what the pruner compares trials at
    prune: bool = True  # Hyperband; off where a trial's early points mislead (a learning rate before its decay)

    @property
    def grid(self) -> dict | None:
        """{setting: choices} when every setting is a list of choices (searched exhaustively), else None."""
        if all("choices" in spec for spec in self.params.values()):
            return {key: list(spec["choices"]) for key, spec in self.params.items()}
        return None

    @property
    def size(self) -> int | None:
        """The number of grid points, or None for a space that is not a grid."""
        return None if self.grid is None else math.prod(len(c) for c in self.grid.values())


def load_space(path: str | Path, model: str) -> Space:
    """The search space of one model, checked: one-line errors name the file, the key and the fix."""
    path = Path(path)
    try:
        spaces = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except FileNotFoundError:
        raise ConfigError(f"{path}: not found (create it, see lmpipe/sweep.py for the format)") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: malformed YAML{yaml_error_place(exc)} (fix the syntax)") from None
    if model not in spaces:
        raise ConfigError(f"{path}: no search space for {model!r} (have: {', '.join(spaces) or 'none'})")
    entry = spaces[model] or {}
    budget, params = entry.get("budget"), entry.get("space")
    if not isinstance(budget, dict) or len(budget) != 1 or next(iter(budget)) not in ("tokens", "flops"):
        raise ConfigError(f"{path}: {model}.budget must be {{tokens: N}} or {{flops: F}} (a trial's fixed length)")
    if not isinstance(params, dict) or not params:
        raise ConfigError(f"{path}: {model}.space must map settings (e.g. optim.lr) to ranges or choices")
    for key, spec in params.items():
        if not isinstance(spec, dict) or not ({"low", "high"} <= set(spec) or "choices" in spec):
            raise ConfigError(f"{path}: {model}.space.{key} needs low and high, or choices")
    if not isinstance(entry.get("prune", True), bool):
        raise ConfigError(f"{path}: {model}.prune must be true or false")
    return Space(model, {k: float(v) if k == "flops" else int(v) for k, v in budget.items()}, params,
                 int(entry.get("evals_per_epoch", 4)), entry.get("prune", True))


def suggest(trial, space: Space) -> dict:
    """One point of the space, as dotted overrides of the model's settings."""
    chosen = {}
    for key, spec in space.params.items():
        if "choices" in spec:
            chosen[key] = trial.suggest_categorical(key, spec["choices"])
        elif isinstance(spec["low"], int) and isinstance(spec["high"], int):
            chosen[key] = trial.suggest_int(key, spec["low"], spec["high"], log=spec.get("log", False))
        else:
            chosen[key] = trial.suggest_float(key, float(spec["low"]), float(spec["high"]), log=spec.get("log", False))
    return chosen


def study_name(space: Space, base: ModelParams, data_fingerprint: str, seed: int) -> str:
    """Keys the Optuna study to everything that decides its trials: a changed space or corpus starts a new one."""
    return f"{space.model}-" + params_hash({"space": space.params, "budget": space.budget,
                                             "base": base.model_dump(mode="json"), "data": data_fingerprint,
                                             "seed": seed})


def storage(path: str | Path):
    """The Optuna study's SQLite file. Heartbeats let a later run see trials whose process died (SIGKILL) as failed."""
    import optuna

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():  # heartbeats are experimental in Optuna 5
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.storages.RDBStorage(f"sqlite:///{Path(path).resolve()}", heartbeat_interval=15, grace_period=45)


def run_sweep(study, trials: int, seed: int, objective: Callable, on_trial: Callable | None = None,
              grid: dict | None = None) -> None:
    """Run trials until the study holds `trials` finished ones (complete or pruned); resumable.

    A trial that failed (Ctrl-C, or a process that died) is tried again once with the same settings. The sampler
    is re-seeded from (seed, trial number) before every trial, so a resumed sweep draws from the same streams;
    with a `grid` it is Optuna's GridSampler, which takes the points no finished trial has taken yet.
    """
    import optuna

    states = optuna.trial.TrialState
    with warnings.catch_warnings():  # experimental in Optuna 5: the documented way to see dead trials
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
    retried = {t.user_attrs.get("retry_of") for t in study.get_trials(deepcopy=False)}
    for failed in study.get_trials(deepcopy=False, states=(states.FAIL,)):
        if failed.number not in retried:
            study.enqueue_trial(failed.params, user_attrs={"retry_of": failed.number})
    while len(study.get_trials(deepcopy=False, states=(states.COMPLETE, states.PRUNED))) < trials:
        study.sampler = (optuna.samplers.GridSampler(grid, seed=seed) if grid else
                         optuna.samplers.TPESampler(seed=seed + len(study.trials), n_startup_trials=RANDOM_TRIALS))
        study.optimize(objective, n_trials=1, catch=())
        if on_trial:
            on_trial(study.trials[-1])


def trials_table(study) -> list[dict]:
    """One row per trial: number, state, best valid bpb, the settings tried and what the trial cost."""
    rows = []
    for t in study.trials:
        rows.append({"number": t.number, "state": t.state.name, "valid_bpb": t.value,
                     **{k: t.params.get(k) for k in sorted(t.distributions)},
                     **{k: t.user_attrs.get(k) for k in ("evaluations", "tokens_seen", "train_flops", "seconds")}})
    return rows


def best_profile(model: str, overrides: dict) -> dict:
    """The winner as a profile (the format `lmpipe profile` reads): nested `models.<model>` settings."""
    return {"models": {model: nested(overrides)}}


def winner_spread(values: list[float]) -> dict:
    """The winner's valid bpb over its seeds: mean, sample sd (None for one run, as lmpipe.stats.mean_sd has it),
    range and count."""
    mean, sd = stats.mean_sd(values)
    return {"mean": mean, "std": sd, "min": min(values), "max": max(values), "n": len(values)}


def profile_yaml(model: str, best, space: Space, name: str, folder: str | Path) -> str:
    header = (f"# Best of sweep {name}: trial {best.number}, valid bpb {best.value:.4f} at a budget of {space.budget}.\n"
              f"# Use it with:  eval \"dvc exp run $(lmpipe profile {Path(folder).as_posix()}/best.yaml)\"\n")
    return header + yaml.safe_dump(best_profile(model, best.params), sort_keys=True)


def trials_figure(rows: list[dict], model: str, out: str | Path) -> None:
    """Valid bpb of every trial in order; pruned trials at the value they were stopped at, the best so far as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in rows if r["valid_bpb"] is not None]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for state, marker, colour in (("COMPLETE", "o", "tab:blue"), ("PRUNED", "x", "tab:gray")):
        pts = [r for r in done if r["state"] == state]
        ax.scatter([r["number"] for r in pts], [r["valid_bpb"] for r in pts], marker=marker, color=colour,
                   label=state.lower())
    complete = sorted((r for r in done if r["state"] == "COMPLETE"), key=lambda r: r["number"])
    best, line = float("inf"), []
    for r in complete:
        best = min(best, r["valid_bpb"])
        line.append((r["number"], best))
    if line:
        ax.step(*zip(*line), where="post", color="tab:orange", label="best so far")
    ax.set(xlabel="trial", ylabel="valid bits per byte (lower is better)", title=f"Sweep of {model}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
