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
import re
import statistics
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import click
import yaml

from lmpipe.config import params_hash, yaml_error_place
from lmpipe.model_params import ModelParams
from lmpipe.errors import ConfigError
from lmpipe.io import csv_records
from lmpipe.tables import markdown_table
from lmpipe.overrides import nested

SPACE_FILE = "sweeps/space.yaml"
ABLATIONS = "benchmarks/results/transformer_ablation*.csv"  # benchmarks/transformer_ablation.py's tables
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


def seed_spread(values: list[float]) -> dict:
    """Mean, sample standard deviation (0 for one value) and range of one setting's results over seeds."""
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return {"mean": statistics.fmean(values), "std": std, "min": min(values), "max": max(values), "n": len(values)}


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


def _ablation_flops(settings: str) -> float | None:
    """An ablation row's training FLOPs, from the budget that opens its settings column."""
    budget = re.match(r"budget=\{flops: ([^}]+)\}", settings)
    return float(budget[1]) if budget else None


def _recipe(settings: str) -> dict:
    """An ablation row's settings column as {key: value}, the budget left out; a later value of a key wins."""
    return dict(item.split("=", 1) for item in re.sub(r"^budget=\{[^}]*\}\s*", "", settings).split())


def ablation_markdown(tables: list[Path]) -> list[str]:
    """The transformer ablations (benchmarks/transformer_ablation.py), one table per FLOP budget, from their CSVs."""
    if not tables:
        return []
    lines = ["## The transformer, one modern part at a time", "",
             "Written from the CSVs of `benchmarks/transformer_ablation.py`: each row trains `models.transformer` (4 x 64,",
             "128-token window) with the recipe in the CSV for the same training FLOPs and scores valid and test as the",
             "evaluate stage does, one seed (`train.seed`). Two rows ran side by side on one thread each, so a row's",
             "seconds depend on what ran beside it; its bpb does not. The machine and precision of each table, and",
             "what was decided from it: [sweeps/notes.md](../sweeps/notes.md).", ""]
    for path in tables:
        rows = csv_records(path)
        if not rows:
            continue
        first = float(rows[0]["valid_bpb"])
        base = _recipe(rows[0]["settings"])
        table = []
        for r in rows:
            settings = " ".join(f"`{k}={v}`" for k, v in _recipe(r["settings"]).items() if base.get(k) != v) or "(none)"
            table.append([r["row"], settings, f"{float(r['valid_bpb']):.4f}", f"{float(r['valid_bpb']) - first:+.4f}",
                          f"{float(r['test_bpb']):.4f}", f"{float(r['train_seconds']):.0f}"])
        flops = _ablation_flops(rows[0]["settings"])
        lines += [f"### {flops:.1e} training FLOPs ([{path.name}](../{path.as_posix()}))", ""]
        lines += markdown_table(["row", "settings other than the first row's", "valid bpb", "vs first row",
                                 "test bpb", "train s"], table) + [""]
    return lines


def sweep_outcomes(sweeps_dir: str | Path) -> list[tuple[Path, Path]]:
    """(outcome folder, its space file) of every committed sweep: sweeps/<model> of sweeps/space.yaml, and
    sweeps/<space>/<model> of sweeps/<space>.yaml."""
    sweeps_dir = Path(sweeps_dir)
    found = []
    for trials in sorted(sweeps_dir.glob("*/trials.csv")) + sorted(sweeps_dir.glob("*/*/trials.csv")):
        folder = trials.parent
        space_file = (Path(SPACE_FILE) if folder.parent == sweeps_dir
                      else sweeps_dir / f"{folder.parent.name}.yaml")
        found.append((folder, space_file))
    return found


def grid_summary(outcomes: list[tuple[Path, Path]], space_file: Path) -> list[str]:
    """One row per model of a grid sweep: every point tried (its values, in the order of the settings) with its valid
    bpb, the best in bold."""
    spaces = yaml.safe_load(space_file.read_text()) or {} if space_file.exists() else {}
    rows = []
    for folder, file in outcomes:
        space = spaces.get(folder.name) or {}
        if file != space_file or not all("choices" in spec for spec in (space.get("space") or {"-": {}}).values()):
            continue  # not a grid
        trials = [r for r in csv_records(folder / "trials.csv") if r["state"] == "COMPLETE"]
        keys = [k for k in trials[0] if k not in ("number", "state", "valid_bpb", "evaluations", "tokens_seen",
                                                   "train_flops", "seconds")] if trials else []
        if not keys:
            continue
        best = min(trials, key=lambda r: float(r["valid_bpb"]))
        tried = sorted(trials, key=lambda r: [_number_or_text(r[k]) for k in keys])
        cells = [f"{'**' if r is best else ''}{', '.join(_shown(r[k]) for k in keys)}: {float(r['valid_bpb']):.4f}"
                 f"{'**' if r is best else ''}" for r in tried]
        flops = {f"{float(r['train_flops']):.3g}" for r in tried}
        setting = ", ".join(f"`{k}`" for k in keys)
        rows.append([folder.name, setting, " · ".join(cells), ", ".join(sorted(flops))])
    if not rows:
        return []
    return [f"### The same sweep for every model ({space_file.name})", "", *markdown_table(
        ["model", "setting", "value tried: valid bpb (best in bold)", "training FLOPs per trial"], rows), ""]


def effort_markdown(outcomes: list[tuple[Path, Path]], ablations: list[Path]) -> list[str]:
    """How much tuning each family's settings came from: the runs of its sweeps and (the transformer's) ablations,
    their training FLOPs and the settings they varied. Reruns of a winner with other seeds are not counted: they
    measure noise, they choose nothing."""
    effort: dict[str, dict] = {}

    def add(model: str, source: str, runs: int, flops: float, settings: list[str]) -> None:
        entry = effort.setdefault(model, {"runs": 0, "flops": 0.0, "settings": {}, "sources": []})
        entry["runs"] += runs
        entry["flops"] += flops
        entry["settings"].update(dict.fromkeys(settings))
        entry["sources"].append(f"{source} ({runs})")

    for folder, _ in outcomes:
        trials = csv_records(folder / "trials.csv")
        varied = [k for k in (trials[0] if trials else {}) if "." in k or k == "batch_size"]
        add(folder.name, folder.as_posix(), len(trials), sum(float(r["train_flops"] or 0) for r in trials), varied)
    for path in ablations:
        rows = csv_records(path)
        varied = list(dict.fromkeys(k for r in rows for k in _recipe(r["settings"])))
        add("transformer", path.as_posix(), len(rows), sum(_ablation_flops(r["settings"]) or 0.0 for r in rows), varied)
    if not effort:
        return []
    table = [[model, str(e["runs"]), f"{e['flops']:.2e}", ", ".join(f"`{k}`" for k in e["settings"]),
              ", ".join(e["sources"])] for model, e in sorted(effort.items(), key=lambda item: -item[1]["runs"])]
    fewest = min(e["runs"] for e in effort.values())
    return ["## Tuning effort per family", "",
            "The runs each family's settings were chosen from (every sweep trial and ablation row, pruned trials "
            "included; reruns of a winner with other seeds measure noise and are not counted), their training FLOPs "
            "and the settings they varied. Every family also has the scaling grid's sizes at every budget "
            "(`lmpipe scaling`), which tries widths alike for all. "
            + ("The effort is equal." if all(e["runs"] == fewest for e in effort.values()) else
               f"The effort is not equal: from {fewest} to {max(e['runs'] for e in effort.values())} runs. A family "
               "tuned over more settings may owe part of its lead to them: a gap no larger than what one of those "
               "settings moved its own loss is about tuning as much as about the family."), "",
            *markdown_table(["family", "runs", "training FLOPs", "settings varied", "from (runs)"], table), ""]


def _number_or_text(value: str) -> tuple:
    """A CSV cell as a sort key: numbers by value, before any text."""
    try:
        return (0, float(value), "")
    except ValueError:
        return (1, 0.0, value)


def _shown(value: str) -> str:
    kind, number, text = _number_or_text(value)
    return f"{number:g}" if kind == 0 else text


def tuning_markdown(sweeps_dir: str | Path) -> str:
    """docs/tuning.md: per swept model its space, trials, the best settings and the seed spread of the winner."""
    sweeps_dir = Path(sweeps_dir)
    lines = ["# Tuning", "",
             "Written by `lmpipe sweep` (flows/sweep.py) from the committed outcome of each sweep in `sweeps/`.",
             "Each trial trains one model of `params.yaml` with some settings drawn from a space file by Optuna",
             "(TPE seeded from the trial number; a space of choices only is a grid, every point once), for a fixed",
             "budget of tokens or training FLOPs - never seconds - so a sweep re-runs to the same trials. Hyperband",
             "stops trials whose validation bits per byte (bpb) trail at an evaluation, where the space allows it.",
             "A winner retrained with other seeds at the same budget says how much of a margin is noise.", "",
             "**One set of settings per family, at every budget.** Each family's settings were chosen at the study's "
             "budget C (the equal-compute sweeps below) and are used unchanged at the smaller budgets C/k that the "
             "study's decay branches give (`study.branches`): a branch is its run up to its decay start, so it "
             "cannot have settings of its own. What that may cost the smaller budgets: a width chosen for C is "
             "likely too wide for C/16 (the NPLM at C was 0.14 bpb better at half its width: an optimum moves "
             "with compute), and a rate tuned for a long stable phase may not be the best for a short one. So "
             "an annealed point below C is an upper bound on that family's best loss at that budget; the scaling "
             "grid (`lmpipe scaling`), which sizes each run for its budget, gives the other side.", ""]
    outcomes = sweep_outcomes(sweeps_dir)
    ablations = sorted(Path(ABLATIONS).parent.glob(Path(ABLATIONS).name))
    lines += effort_markdown(outcomes, ablations)
    for space_file in dict.fromkeys(file for _, file in outcomes):
        spaces = yaml.safe_load(space_file.read_text()) or {} if space_file.exists() else {}
        lines += [f"## Sweeps of [{space_file.as_posix()}](../{space_file.as_posix()})", ""]
        lines += _leading_comment(space_file)
        lines += grid_summary(outcomes, space_file)
        for folder, _ in (o for o in outcomes if o[1] == space_file):
            lines += _sweep_section(folder, spaces.get(folder.name, {}))
    lines += ablation_markdown(ablations)
    if (sweeps_dir / "notes.md").exists():  # hand-kept, dated: linked, never copied (a copy goes stale)
        lines += ["## Probes outside the sweeps", "", "Single runs outside the sweeps, ablations, and why each default "
                  f"is what it is: the dated log [{sweeps_dir.name}/notes.md](../{sweeps_dir.name}/notes.md).", ""]
    return "\n".join(lines) + "\n"


def _leading_comment(space_file: Path) -> list[str]:
    """What a space file says of itself: its first comment block, as a paragraph."""
    said = []
    for line in space_file.read_text(encoding="utf-8").splitlines() if space_file.exists() else []:
        if not line.startswith("#"):
            break
        said.append(line.lstrip("#").strip())
    return [" ".join(said).strip(), ""] if any(said) else []


def _sweep_section(folder: Path, space: dict) -> list[str]:
    model, rel = folder.name, folder.as_posix()
    rows, seeds = csv_records(folder / "trials.csv"), csv_records(folder / "seeds.csv")
    best_yaml = (folder / "best.yaml").read_text() if (folder / "best.yaml").exists() else ""
    states = [r["state"] for r in rows]
    complete = [r for r in rows if r["state"] == "COMPLETE"]
    best = min(complete, key=lambda r: float(r["valid_bpb"])) if complete else None
    lines = [f"### {model} ({rel})", "",
             f"{len(rows)} trials ({states.count('COMPLETE')} complete, {states.count('PRUNED')} pruned); "
             f"budget per trial: {_describe_budget(space.get('budget') or {})}.", ""]
    lines += markdown_table(["setting", "searched"],
                            [[f"`{k}`", _describe_range(v)] for k, v in (space.get("space") or {}).items()])
    if best:
        lines += ["", f"Best: trial {best['number']}, valid bpb **{float(best['valid_bpb']):.4f}**."]
    if best and best_yaml:
        lines += ["", "```yaml", best_yaml.strip(), "```"]
    if seeds:
        values = [float(best["valid_bpb"])] + [float(r["valid_bpb"]) for r in seeds]
        spread = seed_spread(values)
        lines += ["", f"Seed spread of the winner ({spread['n']} seeds: {', '.join(f'{v:.4f}' for v in values)}): "
                      f"mean {spread['mean']:.4f}, standard deviation {spread['std']:.4f}, "
                      f"range {spread['max'] - spread['min']:.4f} bpb."]
    if (folder / "trials.png").exists():
        lines += ["", f"![valid bpb per trial of {model}](../{rel}/trials.png)"]
    return lines + [""]


def _describe_budget(budget: dict) -> str:
    return ", ".join(f"{float(v):.3g} training {k}" for k, v in budget.items()) or "not given"


def _describe_range(spec: dict) -> str:
    if "choices" in spec:
        return "one of " + ", ".join(str(c) for c in spec["choices"])
    return f"{spec['low']} to {spec['high']}" + (" (log scale)" if spec.get("log") else "")
