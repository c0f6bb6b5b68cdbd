"""`lmpipe plan [-S key=value ...]`: before anything runs, what `dvc exp run -S ...` (or, without -S, `dvc repro`)
would re-run, the training FLOPs that implies, and the minutes that takes at the FLOP/s this machine measured.

The stages come from DVC's own status and graph (`planned_stages`), with the settings the overrides move
(those whose value changes); the FLOPs from each model's budget under the overridden params; the rate from the
training runs this machine finished (MLflow: their train_flops over their seconds), else a stated default. `make
study` and `lmpipe retrain` print the same plan first.
"""

from __future__ import annotations

import socket
from pathlib import Path

import yaml

from flows._stage import PARAMS_FILE
from lmpipe.config import load_params, parse_params
from lmpipe.errors import ConfigError
from lmpipe.overrides import apply_overrides, assignments

# No training finished on this machine yet: the study's families ran at 187-328 GFLOP/s on the 2-core EPYC with
# AVX512-BF16; in fp32 on a 2-core AVX2 Zen 3 EPYC at 37-52 GFLOP/s (docs/benchmarks.md#timings).
DEFAULT_FLOPS_PER_S = 2.0e11
FP32_SLOWER = 4.0


def _get(tree, key: str):
    for part in key.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return None
        tree = tree[part]
    return tree


def moved(overrides: list[str], path: str | Path = PARAMS_FILE):
    """({dotted key: new value} of the overrides that change a value, the params with them applied); a bad override
    is a ConfigError of one line, as `check-params` gives."""
    raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    new = apply_overrides(raw, overrides)
    params = parse_params(new, f"{path} with {' '.join(overrides)}" if overrides else path)
    changes = {k: v for k, v in assignments(overrides).items() if _get(raw, k) != _get(new, k)}
    return changes, params


def planned_stages(changes: dict | None = None) -> list[str]:
    """The stages that `dvc repro` (or `dvc exp run`) will run, in its order: dvc.yaml's, and those of other pipelines
    that they take inputs from (the scaling grid's fit, which tracks the models' settings too): each that `dvc
    status` finds changed (a fresh clone: every one), each that tracks a setting `changes` ({dotted key: new value},
    as `-S` gives them) moves, and each downstream of one, whose inputs are about to change. Frozen stages never run.
    (`dvc repro --dry` cannot tell: it lists a stage only once its inputs exist.)"""
    from dvc.repo import Repo
    from dvc.repo.reproduce import get_active_graph, plan_repro

    with Repo() as repo, repo.lock:  # released before `dvc repro` takes it
        graph = get_active_graph(repo.index.graph)  # edges run from a stage to the stages it takes inputs from
        study = [s for s in repo.index.stages if s.dvcfile.relpath == "dvc.yaml"]
        order = plan_repro(graph, study)  # dvc.yaml's stages and their inputs', as `dvc repro` orders them
        runs: dict = {}
        for stage in order:  # every input before the stages that read it
            runs[stage] = bool(getattr(stage, "cmd", None)) and not stage.frozen and (
                any(runs.get(upstream) for upstream in graph.successors(stage)) or stage.changed()
                or bool(changes and tracks(stage, changes)))
        return [s.addressing for s in order if runs[s]]


def tracks(stage, changes: dict) -> bool:
    """Whether `stage` tracks one of the settings in `changes` (its params: a section, a dotted key, or a file)."""
    from dvc.dependency import ParamsDependency

    for dep in stage.deps:
        if isinstance(dep, ParamsDependency):
            names = list(dep.params) or [""]  # no names: the whole file
            if any(not n or k == n or k.startswith(n + ".") or n.startswith(k + ".") for n in names for k in changes):
                return True
    return False


def budgets(params=None, branches: bool = True) -> dict[str, float]:
    """Each model's training FLOPs (its budget or the study's), with its decay branches' (`study.branches`: each
    decays over its own decay_fraction of its budget) unless `branches` is False; a budget in tokens gives no
    estimate."""
    params = params or load_params(PARAMS_FILE)
    found = {}
    for name in params.models:
        settings = params.model_settings(name)
        if settings.budget is None or not settings.budget.flops:
            continue
        found[name] = float(settings.budget.flops)
        if branches and settings.optim.schedule == "wsd":  # another schedule has no branches (the train stage says so)
            found[name] += settings.optim.decay_fraction * sum(params.branches_of(settings))
    return found


def measured_rate(params) -> tuple[float, str]:
    """Training FLOP/s of the latest finished training runs on this machine (MLflow), and where the number is from."""
    try:
        from lmpipe.tracking import tracker
        from lmpipe.tracking.runs import HOST

        store = tracker()
        found = store.client.get_experiment_by_name(params.tracking.experiment)
        runs = [] if found is None else store.runs_in(  # not find_runs: a plan creates no experiment
            found.experiment_id, f"attributes.status = 'FINISHED' and tags.`{HOST}` = '{socket.gethostname()}' "
            "and tags.`lmpipe.stage` LIKE 'train@%'", newest=20)
    except Exception:  # no store, or one that cannot be read: the default, said so
        runs = []
    done = [r.data.metrics for r in runs if r.data.metrics.get("train_flops") and r.data.metrics.get("seconds")]
    if not done:
        from lmpipe.train import autocast_dtype, pick_device

        if autocast_dtype(params.train.precision, pick_device(params.train.device)) is not None:
            return DEFAULT_FLOPS_PER_S, "assumed: no training has finished on this machine yet"
        return (DEFAULT_FLOPS_PER_S / FP32_SLOWER,
                "assumed: no training has finished on this machine yet, and it trains in fp32")
    rate = sum(m["train_flops"] for m in done) / sum(m["seconds"] for m in done)
    return rate, f"measured by the last {len(done)} training run(s) on this machine"


def summary(stages: list[str], params) -> str:
    """The plan's lines: the stages, and the training they hold at this machine's rate."""
    if not stages:
        return "nothing would run: every stage is up to date"
    lines = [f"{len(stages)} stage(s) would run: {', '.join(stages)}"]
    trainings = [s.removeprefix("train@") for s in stages if s.startswith("train@")]
    if trainings:
        budget, runs = budgets(params), budgets(params, branches=False)
        flops = sum(budget.get(m, 0.0) for m in trainings)
        branched = flops - sum(runs.get(m, 0.0) for m in trainings)
        rate, source = measured_rate(params)
        unknown = [m for m in trainings if m not in budget]
        lines.append(f"training: {len(trainings)} model(s), {flops:.2e} FLOPs"
                     + (f" ({flops - branched:.2e} for the runs, {branched:.2e} for their decay branches, "
                        "study.branches)" if branched else "")
                     + f", about {flops / rate / 60:.0f} min at {rate / 1e9:.0f} GFLOP/s ({source})"
                     + (f"; {', '.join(unknown)} train by tokens or epochs, not counted" if unknown else ""))
    return "\n".join(lines)


def plan(overrides: list[str] | None = None) -> str:
    """The plan's lines, after what check-params checks of the settings' inputs: a local corpus file that cannot be
    read is one line here, not a stage failing after DVC removed its outputs."""
    from lmpipe.preflight import input_problems

    changes, params = moved(list(overrides or []))
    problems = input_problems(params, PARAMS_FILE)
    if problems:
        raise ConfigError("; ".join(problems))
    return summary(planned_stages(changes), params)
