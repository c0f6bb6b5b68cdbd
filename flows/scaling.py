"""scaling pipeline (scaling/dvc.yaml), apart from the default study: a grid of runs, then the scaling-law fits.

    dvc repro scaling/dvc.yaml          (or: lmpipe scaling)

grid: every size in params.yaml's `scaling.models` at every budget in `scaling.budgets`, trained by the library's
Trainer on the default pipeline's data/tokens until its FLOP budget is spent; one MLflow child run each under one
`scaling` run. Writes scaling/runs.csv. A finished run's row is kept in .cache/lmpipe/scaling/runs/, keyed by
everything that decides it, and a killed run resumes from its checkpoint: an interrupted grid continues where it
stopped (in the same MLflow run), and a changed budget list retrains only the new points.
fit: the IsoFLOP and parametric fits (lmpipe.scaling) -> reports/scaling.md, reports/scaling.html,
reports/scaling/*.png and metrics/scaling.json, also logged to the grid's MLflow run.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import tempfile
import time
from pathlib import Path

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from flows._stage import CACHE_DIR, PARAMS_FILE, main
from lmpipe import tracking
from lmpipe.config import ModelParams, Params, load_params, params_hash
from lmpipe.errors import ConfigError
from lmpipe.io import atomic_path, csv_text, write_json, write_text
from lmpipe.scaling import GridPoint, analyse, best_per_budget, grid_points, size_label
from lmpipe.splits import TokenData, load_tokens
from lmpipe.sweep import apply
from lmpipe.train import Trainer, code_version

RUNS = Path("scaling/runs.csv")
WORK = Path(CACHE_DIR) / "scaling"
REPORTS, SUMMARY, KN5 = Path("reports"), Path("metrics/scaling.json"), Path("metrics/ngram.json")


def point_settings(point: GridPoint, params: Params) -> ModelParams:
    """The family's settings with the grid's overrides, this size's arch and this budget."""
    overrides = {**params.scaling.overrides, **{f"arch.{k}": v for k, v in point.size.items()}}
    try:
        return apply(params.models[point.model], overrides, {"flops": point.budget})
    except ConfigError as exc:
        raise ConfigError(f"{PARAMS_FILE}: scaling, {point.name}: {exc}") from None


@task(cache_policy=NO_CACHE)
def train_point(point: GridPoint, settings: ModelParams, params: Params, data: TokenData, parent_id: str) -> dict:
    """One run of the grid (or its row from an earlier, identical run)."""
    common = params.train.model_copy(update={"evals_per_epoch": params.scaling.evals_per_epoch})
    key = params_hash({"settings": settings.model_dump(mode="json"), "train": common.model_dump(mode="json"),
                       "code": code_version(), "data": data.fingerprint})
    done = WORK / "runs" / f"{point.name}-{key}.json"
    tags = {"lmpipe.role": "scaling-run", "lmpipe.model": point.model, "lmpipe.point": key}
    if done.exists():  # trained before: its row again, and a child run here too when this scaling run lacks one
        row = json.loads(done.read_text())
        row.setdefault("valid_loss", math.log(row["valid_ppl"]))  # rows cached before the column existed
        if not tracking.find_runs(params.tracking.experiment, {"lmpipe.point": key, "mlflow.parentRunId": parent_id}):
            with tracking.run(params.tracking.experiment, point.name, settings.model_dump(mode="json"),
                              parent_run_id=parent_id, tags={**tags, "lmpipe.reused": "a finished run of an earlier grid"}):
                tracking.log_metrics({k: v for k, v in row.items() if k not in ("budget",)})
        print(f"{point.name}: valid bpb {row['valid_bpb']:.4f} (trained before, reused)", flush=True)
        return row
    started = time.perf_counter()
    with tracking.run(params.tracking.experiment, point.name, settings.model_dump(mode="json"), parent_run_id=parent_id,
                      tags=tags) as run:
        m = Trainer(point.model, settings, common, data, WORK / "ckpt" / key, progress_bar=False,
                    on_eval=lambda record: tracking.log_evaluation(record, run.info.run_id)).run().metrics
        tracking.log_metrics(m)
    row = {"name": point.name, "model": point.model, "family": settings.family, "size": size_label(point.size),
           "budget": point.budget, "n_params": m["n_params"], "n_params_non_embedding": m["n_params_non_embedding"],
           "tokens": m["tokens_seen"], "flops": m["train_flops"], "epochs": m["epochs"],
           "epoch_tokens": len(data.splits["train"].tokens), "valid_bpb": m["valid_bpb"], "valid_ppl": m["valid_ppl"],
           "valid_loss": math.log(m["valid_ppl"]),
           "train_seconds": m["seconds"], "wall_seconds": time.perf_counter() - started,
           "flops_per_sec": m["flops_per_sec"], "device": m["device"]}
    write_json(done, row)
    print(f"{point.name}: valid bpb {m['valid_bpb']:.4f}, N {m['n_params']:,}, D {m['tokens_seen']:,} tokens, "
          f"{row['wall_seconds']:.0f} s", flush=True)
    return row


@flow(name="scaling-grid")
def grid() -> str:
    params, data = load_params(PARAMS_FILE), load_tokens()
    if not params.scaling.models or not params.scaling.budgets:
        raise ConfigError(f"{PARAMS_FILE}: scaling.models and scaling.budgets must list at least one model and budget")
    points = grid_points(params.scaling.models, params.scaling.budgets)
    settings = [point_settings(p, params) for p in points]  # every typo before the first hour of training
    section = params.section("scaling")
    key = params_hash({"scaling": {k: v for k, v in section.items() if k != "fit"}, "train": params.section("train"),
                       "models": {m: params.models[m].model_dump(mode="json") for m in params.scaling.models},
                       "code": code_version(), "data": data.fingerprint})
    with tracking.run(params.tracking.experiment, f"scaling {key[:8]}", {"scaling": section},
                      tags={"lmpipe.role": "scaling"}, resume={"lmpipe.scaling": key}) as parent:
        rows = [train_point(p, s, params, data, parent.info.run_id) for p, s in zip(points, settings)]
        write_text(RUNS, csv_text(rows))
        tracking.log_metrics({"runs": len(rows), "grid_seconds": sum(r["wall_seconds"] for r in rows)})
        tracking.log_artifacts(RUNS)
        tracking.mark_output(RUNS)
    return str(RUNS)


def read_runs(path: Path = RUNS) -> list[dict]:
    if not path.exists():
        raise ConfigError(f"{path}: no grid results (run: dvc repro scaling/dvc.yaml)")
    with open(path) as f:
        return list(csv.DictReader(f))


@flow(name="scaling-fit")
def fit() -> str:
    from lmpipe.scaling_report import write_scaling_report

    params, rows = load_params(PARAMS_FILE), read_runs()
    settings = params.scaling.fit
    analysis = analyse(rows, settings.bootstrap, settings.seed, settings.huber_delta)
    best = best_per_budget(rows)
    kn5 = json.loads(KN5.read_text())["valid"]["bpb"] if KN5.exists() else None
    meta = {"sizes": max(len(v) for v in params.scaling.models.values()), "budgets": len({r["budget"] for r in rows}),
            "min_budget": min(float(r["budget"]) for r in rows), "max_budget": max(float(r["budget"]) for r in rows),
            "train_tokens": int(rows[0]["epoch_tokens"]), "seconds": sum(float(r["wall_seconds"]) for r in rows),
            "device": ", ".join(sorted({r["device"] for r in rows})), "bootstrap": settings.bootstrap,
            "huber_delta": settings.huber_delta}
    summary = {"kn5_valid_bpb": kn5, "best_per_budget": best, "families": analysis, "grid_seconds": meta["seconds"]}
    with tempfile.TemporaryDirectory(dir=REPORTS, prefix=".scaling-") as build:  # the report, its HTML, its figures
        tmp = Path(build)
        write_scaling_report(rows, analysis, best, kn5, meta, tmp)
        with atomic_path(REPORTS / "scaling") as figures:
            (tmp / "scaling").rename(figures)
        for name in ("scaling.md", "scaling.html"):
            (tmp / name).replace(REPORTS / name)
    write_json(SUMMARY, summary)
    parent = tracking.run_of_output(params.tracking.experiment, RUNS)
    if parent:  # the fits beside the runs they come from
        tracking.log_metrics({f"{m}.{k}": v for m, a in analysis.items() for k, v in
                              {**a["law"], **{f"law_{e}": x for e, x in a["law_exponents"].items()},
                               "holdout_mean_abs_relative_error": a["holdout"]["mean_abs_relative_error"]}.items()
                              if v is not None}, run_id=parent)
        for path in (REPORTS / "scaling.md", REPORTS / "scaling.html", REPORTS / "scaling", SUMMARY):
            tracking.log_artifacts(path, "scaling-report", run_id=parent)
    return str(REPORTS / "scaling.md")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="the scaling-law experiment's stages (scaling/dvc.yaml)")
    parser.add_argument("stage", choices=["grid", "fit"])
    main({"grid": grid, "fit": fit}[parser.parse_args().stage])
