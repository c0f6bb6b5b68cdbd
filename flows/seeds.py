"""seeds pipeline (seeds/dvc.yaml), apart from the default study: every model of params.yaml retrained with the seeds
of `seeds.extra`, exactly as its train@<model> stage trains it but for `train.seed`, and scored on valid and test as
the evaluate stage scores it. Writes seeds/seeds.csv: those runs and the study's own (its numbers from
metrics/eval.json), which the study's report turns into mean ± sd and verdicts (lmpipe/seeds.py). With the study's
decay branches (`study.branches`) each seed's run gives its branches too, as train@<model> does: seeds/budgets.csv
holds every seed's annealed result at each budget, the sd of each point of the report's "As compute grows".
seeds/weat.csv holds each seed's WEAT effect sizes, audited as the audit stage audits the study's models.

    lmpipe seeds        (runs this flow, then `dvc commit seeds/dvc.yaml`: the stage is frozen, so that the study's
                         `dvc repro` never starts its hour of training)

Cached and resumable like the scaling grid: a finished run's row is kept in .cache/lmpipe/seeds/runs/, keyed by
everything that decides it, and a killed run resumes from its checkpoint; a changed model retrains only its own seeds.
With `orchestration.task_runner` dask (or ray) the runs train side by side on its workers, as the grid's do
(flows.runners.run_apart; docs/scale-out.md); a failed run stops no other.
`lmpipe seeds --models transformer` retrains that model's seeds alone and keeps the other models' rows as they are.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from flows._stage import PARAMS_FILE, main
from flows.runners import in_project, orchestration_with, results, run_apart
from flows.train import anneal, branch_budgets, made_by, study_branches
from lmpipe import checkpoints, paths, tracking
from lmpipe.checkpoints import code_version
from lmpipe.config import Params, load_params, params_hash
from lmpipe.errors import LmpipeError
from lmpipe.evaluate import evaluate_lm
from lmpipe.io import write_text
from lmpipe.audit import audit, effect_sizes, load_tests, model_lookup, word_counts
from lmpipe.seeds import BUDGET_COLUMNS, WEAT_COLUMNS, budget_rows, csv_rows, read_rows, spread, study_row, weat_rows
from lmpipe.splits import TokenData, load_tokens
from lmpipe.train import autocast_dtype, pick_device
from lmpipe.train.job import prepare, publish

WORK = Path(paths.CACHE_DIR) / "seeds"


def study_runs(params: Params) -> dict[str, dict]:
    """Each model's row of the study's own run, from the evaluation and the training summary it holds now."""
    evaluation = json.loads(Path(paths.EVAL).read_text())["models"]
    missing = [m for m in params.models if m not in evaluation]
    if missing:
        raise LmpipeError(f"{paths.EVAL} has no result for {', '.join(missing)}: run the study first (dvc repro)")
    trained = {m: json.loads(Path(paths.train_metrics(m)).read_text()) for m in params.models}
    precision = {m: t["precision"] for m, t in trained.items()}
    here = "bf16" if autocast_dtype(params.train.precision, pick_device(params.train.device)) is not None else "fp32"
    other = sorted(m for m, p in precision.items() if p != here)
    if other:  # a spread over runs of two precisions measures the precision too
        raise LmpipeError(f"{paths.train_metrics(other[0])}: the study trained {', '.join(other)} in "
                          f"{precision[other[0]]}, this machine trains in {here} (train.precision: "
                          f"{params.train.precision}); re-run the study here first (dvc repro --force), or run "
                          "lmpipe seeds where the study ran")
    return {m: study_row(m, params.train.seed, evaluation[m], trained[m]) for m in params.models}


def study_budget_rows(params: Params, models: list[str]) -> list[dict]:
    """The study's own annealed results of `models` (metrics/train/<model>.json's `budgets`: none without
    branches), as rows of seeds/budgets.csv."""
    return [row for m in models for row in budget_rows(
        m, params.train.seed, json.loads(Path(paths.train_metrics(m)).read_text()).get("budgets", []))]


def weat_of(params: Params) -> Callable:
    """A model's WEAT effect sizes, audited as the audit stage audits the study's (lmpipe.audit): the seeds' spread
    of each effect size."""
    from tokenizers import Tokenizer

    counts = word_counts(Path(paths.TRAIN_TEXT).read_text(encoding="utf-8"))
    tests, tokenizer, a = load_tests(params.audit.custom_tests), Tokenizer.from_file(paths.TOKENIZER), params.audit
    return lambda model: effect_sizes(audit(model_lookup(model, tokenizer, a.embedding), counts, tests, a.min_count,
                                            a.min_words, a.max_permutations, a.seed)[0])


def study_weat_rows(params: Params, models: list[str]) -> list[dict]:
    """The study's own audit of `models` (metrics/weat.json), as rows of seeds/weat.csv."""
    audited = json.loads(Path(paths.WEAT).read_text())["models"] if Path(paths.WEAT).exists() else {}
    return [row for m in models for row in weat_rows(m, params.train.seed, audited.get(m, {}))]


@task(cache_policy=NO_CACHE, task_run_name="{model}-seed{seed}")
def train_seed(model: str, seed: int, params: Params, data: TokenData, parent_id: str, cwd: str | None = None) -> dict:
    """One model at one seed, trained and scored (and audited, `weat_of`), or its row from an earlier, identical run
    (`Job.cached`); with the study's decay branches, its annealed results at each budget too, as train@<model> gives
    them. `cwd`: the project, where a worker of a cluster runs it (flows.runners.in_project)."""
    with in_project(cwd):
        return _train_seed(model, seed, params, data, parent_id)


def _train_seed(model: str, seed: int, params: Params, data: TokenData, parent_id: str) -> dict:
    job = prepare(params, model, WORK / "ckpt", train={"seed": seed}, data=data, params_file=PARAMS_FILE)
    branches = study_branches(params, job)
    key = job.key(**{"evaluate.chunk": params.evaluate.chunk, "audit": params.section("audit"),
                     **branch_budgets(branches)})
    name = f"{model}-seed{seed}"
    tags = {"lmpipe.role": "seed-run", "lmpipe.model": model, "lmpipe.seed_run": key}

    def train() -> dict:
        started = time.perf_counter()
        with tracking.runs.run(params.tracking.experiment, name, {"model": job.settings.model_dump(mode="json"),
                                                                  "seed": seed}, parent_run_id=parent_id, tags=tags) as run:
            result = job.run(on_eval=lambda record: tracking.log_evaluation(record, run.info.run_id), branches=branches)
            scores = evaluate_lm(result.model.eval(), data, params.evaluate.chunk)
            if branches:
                result.metrics["budgets"] = anneal.fn(job, result, branches, run.info.run_id)
            publish(run, result)
            tracking.log_metrics({f"test_{k}": v for k, v in scores["test"].items()}, run_id=run.info.run_id)
        row = {"model": model, "seed": seed, "valid_bpb": scores["valid"]["bpb"], "test_bpb": scores["test"]["bpb"],
               "test_word_ppl": scores["test"]["word_ppl"], "precision": result.metrics["precision"],
               **made_by(job, branches), "budgets": result.metrics.get("budgets", []),
               "weat": weat_of(params)(result.model.eval()), "seconds": time.perf_counter() - started}
        print(f"{name}: test bpb {row['test_bpb']:.4f}, word ppl {row['test_word_ppl']:.1f} ({row['seconds']:.0f} s)",
              flush=True)
        return row

    row = job.cached(WORK / "runs", name, key, train,
                     lambda row: print(f"{name}: test bpb {row['test_bpb']:.4f} (trained before, reused)", flush=True))
    row = {**made_by(job, branches), **row}  # a row kept before identities were recorded gets them
    for branch in branches:  # the row is kept: the branches' checkpoints go too
        checkpoints.discard(branch.ckpt_dir)
    return row


def train_seeds(runs: list[tuple[str, int]], params: Params, data: TokenData, parent_id: str) -> list[dict]:
    """Each (model, seed)'s row, in the order of `runs`, on the task runner of `orchestration`: side by side on its
    workers, at most KEEP runs of one model at a time (a model keeps only its newest KEEP unfinished runs'
    checkpoints). A failed run is named after the others have finished (their rows cached)."""
    outcomes = run_apart(train_seed, [{"model": m, "seed": seed, "params": params, "data": data,
                                       "parent_id": parent_id} for m, seed in runs],
                         [m for m, _ in runs], params.orchestration, per_group=checkpoints.KEEP, name="seed-runs")
    return results([f"{m}-seed{seed}" for m, seed in runs], outcomes, "seed runs")


def summary_lines(rows: list[dict]) -> list[str]:
    """model: mean ± sd of test bpb over its seeds (lmpipe.seeds.spread, as the report), for the console."""
    lines = []
    for model in sorted({r["model"] for r in rows}):
        s = spread([r for r in rows if r["model"] == model])
        lines.append(f"{model}: test bpb {s.bpb:.4f}" + (f" ± {s.bpb_sd:.4f}" if s.bpb_sd is not None else "")
                     + f" over {s.n} seeds")
    return lines


def kept_rows(path: str, models: list[str], params: Params) -> list[dict]:
    """The rows of seeds/seeds.csv (or seeds/budgets.csv) of the models not retrained this time, as they are: the
    report still drops a model's rows whose study run no longer matches the study's numbers (lmpipe.seeds)."""
    return [r for r in read_rows(path) if r["model"] in params.models and r["model"] not in models]


@flow(name="seeds")
def seeds(models: list[str] | None = None, workers: int | None = None, address: str | None = None) -> str:
    """Retrain `models` (default: all of params.yaml) with each seed of seeds.extra; other models keep their rows.
    The runs spread as `orchestration` says, or as `workers`/`address` do (flows.runners.spread_options)."""
    params, data = load_params(PARAMS_FILE), load_tokens()
    params = params.model_copy(update={"orchestration": orchestration_with(params.orchestration, workers, address)})
    unknown = [m for m in models or [] if m not in params.models]
    if unknown:
        raise LmpipeError(f"{PARAMS_FILE}: models has no entry {unknown[0]!r} (have: {', '.join(params.models)})")
    chosen = models or list(params.models)
    # a seed of every model before the next: a stopped run has the most spread
    runs = [(m, seed) for seed in params.seeds.extra for m in chosen]
    own = study_runs(params)  # before any training: a study that does not match fails at once
    key = params_hash({"seeds": params.section("seeds"), "train": params.section("train"),
                       "models": {m: s.model_dump(mode="json") for m, s in params.models.items()},
                       "code": code_version(), "data": data.fingerprint})
    with tracking.runs.run(params.tracking.experiment, f"seeds {key[:8]}", {"seeds": params.section("seeds")},
                           tags={"lmpipe.role": "seeds"}, resume={"lmpipe.seeds": key}) as parent:
        rows = kept_rows(paths.SEEDS, chosen, params) + [own[m] for m in chosen]
        budgets = kept_rows(paths.SEED_BUDGETS, chosen, params) + study_budget_rows(params, chosen)
        effects = kept_rows(paths.SEED_WEAT, chosen, params) + study_weat_rows(params, chosen)
        weat_of(params)  # the audit's inputs, read before any training: a missing one fails at once
        for (m, seed), row in zip(runs, train_seeds(runs, params, data, parent.info.run_id)):
            rows.append(row)
            budgets += budget_rows(m, seed, row.get("budgets", []))
            effects += weat_rows(m, seed, row.get("weat", {}))
        write_text(paths.SEEDS, csv_rows(rows))
        write_text(paths.SEED_BUDGETS, csv_rows(budgets, BUDGET_COLUMNS))
        write_text(paths.SEED_WEAT, csv_rows(effects, WEAT_COLUMNS))
        for path in (paths.SEEDS, paths.SEED_BUDGETS, paths.SEED_WEAT):
            tracking.log_artifacts(path)
    for line in summary_lines(rows):
        print(line, flush=True)
    return paths.SEEDS


if __name__ == "__main__":
    import click

    from flows.runners import spread_options
    from lmpipe.seeds import models_option

    @click.command(help="Retrain models with the seeds of seeds.extra (lmpipe seeds runs this, then commits it).")
    @models_option
    @spread_options
    def run(models: tuple[str, ...], workers: int | None, address: str | None) -> None:
        main(seeds, models=list(models) or None, workers=workers, address=address)

    run()
