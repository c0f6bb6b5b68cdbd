"""scaling pipeline's `fit` stage (scaling/dvc.yaml): the IsoFLOP and parametric fits (lmpipe.scaling) of the
grid's runs -> reports/scaling.md, reports/scaling.html, reports/scaling/*.png and metrics/scaling.json, also logged
to the grid's MLflow run. The study's report reads metrics/scaling.json, so `dvc repro` runs this stage when it is
out of date; the grid itself is frozen (`lmpipe scaling` runs it). Whether the grid is still the study's (made from
its data and settings now) is the study report's to say, so a retrain of one model never re-runs these fits."""

from __future__ import annotations

from lmpipe.blas import pin_kernel

pin_kernel()  # before NumPy loads: the fits' L-BFGS runs on the same BLAS kernels on every CPU of a kind

import json
import tempfile
from collections import Counter
from pathlib import Path

from prefect import flow

from lmpipe import paths
from flows._stage import PARAMS_FILE, main
from lmpipe import tracking
from lmpipe.compare import baseline_label
from lmpipe.config import load_params
from lmpipe.errors import ConfigError
from lmpipe.io import atomic_path, csv_records, write_json
from lmpipe.scaling import analyse, best_per_budget, frontier, mean_over_seeds, seed_spread

REPORTS, SUMMARY, NGRAM = Path(paths.REPORTS), Path(paths.SCALING_METRICS), Path(paths.NGRAM_METRICS)


def read_runs(path: Path = Path(paths.RUNS)) -> list[dict]:
    if not path.exists():
        raise ConfigError(f"{path}: no grid results (run: lmpipe scaling)")
    return csv_records(path)


@flow(name="scaling-fit")
def fit() -> str:
    from lmpipe.scaling_report import write_scaling_report

    params, runs = load_params(PARAMS_FILE), read_runs()
    rows = mean_over_seeds(runs)  # one row a point: its runs' mean where it has several seeds
    settings = params.scaling.fit
    analysis = analyse(rows, settings.bootstrap, settings.seed, settings.huber_delta)
    best = best_per_budget(rows)
    baseline = (baseline_label(params.ngram), json.loads(NGRAM.read_text())["valid"]["bpb"]) if NGRAM.exists() else None
    per_budget = Counter((r["model"], r["budget"]) for r in rows).values()
    meta = {"sizes": (min(per_budget), max(per_budget)), "budgets": len({r["budget"] for r in rows}),
            "min_budget": min(float(r["budget"]) for r in rows), "max_budget": max(float(r["budget"]) for r in rows),
            "train_tokens": int(rows[0]["epoch_tokens"]), "flops": sum(float(r["flops"]) for r in runs),
            "device": ", ".join(sorted({r["device"] for r in rows})), "bootstrap": settings.bootstrap,
            "huber_delta": settings.huber_delta, "runs": len(runs), "seed_spread": seed_spread(rows)}
    summary = {"baseline": baseline and {"label": baseline[0], "valid_bpb": baseline[1]}, "best_per_budget": best,
               "frontier": frontier(rows), "families": analysis, "grid_flops": meta["flops"],
               "runs": meta["runs"], "seed_spread": meta["seed_spread"],
               "grid": {"families": sorted({r["model"] for r in rows}), "min_budget": meta["min_budget"],
                        "max_budget": meta["max_budget"], "max_params": max(int(r["n_params"]) for r in rows),
                        "overrides": params.scaling.overrides}}
    with tempfile.TemporaryDirectory(dir=REPORTS, prefix=".scaling-") as build:  # the report, its HTML, its figures
        tmp = Path(build)
        write_scaling_report(rows, analysis, best, baseline, meta, tmp)
        with atomic_path(REPORTS / "scaling") as figures:
            (tmp / "scaling").rename(figures)
        for name in ("scaling.md", "scaling.html"):
            (tmp / name).replace(REPORTS / name)
    write_json(SUMMARY, summary)
    parent = tracking.run_of_output(params.tracking.experiment, paths.RUNS)
    if parent:  # the fits beside the runs they come from
        tracking.log_metrics({f"{m}.{k}": v for m, a in analysis.items() for k, v in
                              {**a["law"], **{f"law_{e}": x for e, x in a["law_exponents"].items()},
                               "holdout_mean_abs_relative_error": a["holdout"]["mean_abs_relative_error"]}.items()
                              if v is not None}, run_id=parent)
        for path in (REPORTS / "scaling.md", REPORTS / "scaling.html", REPORTS / "scaling", SUMMARY):
            tracking.log_artifacts(path, "scaling-report", run_id=parent)
    return str(REPORTS / "scaling.md")


if __name__ == "__main__":
    main(fit)
