"""Train the scaling grid's runs around each IsoFLOP minimum again with another seed: how far each minimum moves.

Every grid run has one seed (train.seed), and a size keeps that seed's initial weights and data order at every
budget: a seed's luck may then be an offset of the size at all budgets, which would move the minima in steps as the
best size changes, not at random. This retrains, for each family at each budget given, the grid's best size and its
two neighbours (scaling/runs.csv) with --seed, and prints each run's two losses and each budget's minimum under
either seed and their mean (lmpipe.scaling.isoflop_minimum). From the checkout's root, the runs side by side on
`orchestration`'s task runner as `lmpipe scaling` trains the grid's (docs/scale-out.md):

    PYTHONPATH=. python sweeps/grid_seed_check.py
    PYTHONPATH=. python sweeps/grid_seed_check.py --export sweeps/grid_seed1_<date>.csv

(--budgets: others of the grid's budgets than its three cheapest, the default; --dry-run: list the runs to train,
train nothing.)

Rows are cached beside the grid's (flows.scaling.ROWS, named <point>-seed<seed>): a killed run resumes. --export
trains nothing (it needs every row): it writes the runs as the grid's CSVs hold rows (sweeps/reuse_grid_rows.py
carries them to changed code like those) and prints each pair.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

import pandas as pd

from flows._stage import PARAMS_FILE
from flows.scaling import COLUMNS, ROWS, prepare_point, row_key, train_points
from lmpipe import tracking
from lmpipe.config import load_params
from lmpipe.io import csv_text, write_text
from lmpipe.paths import RUNS
from lmpipe.scaling import GridPoint, isoflop_minimum, power_law, size_label
from lmpipe.scaling_report import half_width
from lmpipe.splits import load_tokens
from lmpipe.train.job import row_file

CHEAPEST = [4.6875e11, 6.62913e11, 9.375e11]  # C/64, C/45, C/32: the grid's three cheapest budgets


def around_minima(grid: pd.DataFrame, sizes: dict[str, list[dict]], budgets: list[float], seed: int) -> list:
    """(point at `seed`, its grid row) for the best size of each family at each budget and its neighbours in size."""
    unknown = sorted(set(budgets) - set(grid.budget))
    if unknown:
        sys.exit(f"--budgets {' '.join(f'{b:g}' for b in unknown)}: not a budget of {RUNS} (have: "
                 f"{' '.join(f'{b:g}' for b in sorted(set(grid.budget)))})")
    chosen = []
    for (model, budget), at in grid[grid.budget.isin(budgets)].groupby(["model", "budget"]):
        at = at.sort_values("n_params").reset_index(drop=True)
        best = int(at.valid_bpb.idxmin())
        by_label = {size_label(s): s for s in sizes[model]}
        chosen += [(GridPoint(model, by_label[row.size], float(budget), seed), row)
                   for row in at.iloc[max(best - 1, 0):best + 2].itertuples()]
    return chosen


def vertex(minimum: dict) -> str:
    return f"{minimum['n_opt']:,.0f}" + ("" if minimum["bracketed"] else f" ({minimum['edge']} size)")


def exponent(minima: list[tuple[float, dict]]) -> str:
    """N_opt's exponent through the minima bracketed by their three runs, with its 90% interval (lmpipe.scaling)."""
    inside = [(budget, m["n_opt"]) for budget, m in minima if m["bracketed"]]
    if len(inside) < 3:
        return f"{len(inside)} bracketed"
    line = power_law(*zip(*inside))
    return f"{line['exponent']:.3f} +-{half_width(line):.3f} ({len(inside)} minima)"


def seed_sd(differences: pd.Series) -> str:
    """A run's seed sd from the differences of pairs of runs (each difference has twice a run's variance)."""
    return f"{math.sqrt((differences ** 2).mean() / 2):.4f} bpb ({len(differences)} pairs)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1, help="train.seed of the runs again (default 1)")
    parser.add_argument("--budgets", type=float, nargs="+", default=CHEAPEST)
    parser.add_argument("--export", help="write these runs to this CSV and compare each with the grid's; train nothing")
    parser.add_argument("--dry-run", action="store_true", help="list the runs to train, train nothing")
    args = parser.parse_args()
    params, data = load_params(PARAMS_FILE), load_tokens()
    grid = pd.read_csv(RUNS)
    points = [(p, row, prepare_point(p, params, data))
              for p, row in around_minima(grid, params.scaling.all_sizes(), args.budgets, args.seed)]
    if args.dry_run:  # row_key builds each run's trainer: here alone, where no worker trains it after
        todo = [p for p, _, job in points if not row_file(ROWS, p.name, row_key(job)).exists()]
        print(f"{len(todo)} of {len(points)} points to train", flush=True)
        return print("\n".join(p.name for p in todo))
    if not args.export:  # every point: a cached one gives its row back at once
        with tracking.runs.run(params.tracking.experiment, f"scaling seed {args.seed} check", {"seed": args.seed},
                               tags={"lmpipe.role": "scaling-seed-check"},
                               resume={"lmpipe.scaling_seed_check": str(args.seed)}) as parent:
            train_points([p for p, _, _ in points], [job for _, _, job in points], params, parent.info.run_id)
        return
    cached = [(p, row, row_file(ROWS, p.name, row_key(job))) for p, row, job in points]
    missing = [p.name for p, _, path in cached if not path.exists()]
    if missing:
        sys.exit(f"--export: {len(missing)} runs not trained yet, e.g. {missing[0]}: train them first (no --export)")
    trained = [{**json.loads(path.read_text()), "cache_file": path.name} for _, _, path in cached]
    write_text(args.export, csv_text(trained, [*COLUMNS, "train_seconds", "wall_seconds", "flops_per_sec", "precision",
                                               "cache_file"]))
    first, again = f"seed {params.train.seed}", f"seed {args.seed}"  # the grid's run, this one
    table = pd.DataFrame([{"model": p.model, "budget": p.budget, "n_params": row.n_params, first: row.valid_bpb,
                           again: r["valid_bpb"], "difference": r["valid_bpb"] - row.valid_bpb}
                          for (p, row, _), r in zip(cached, trained)])
    table["mean"] = (table[first] + table[again]) / 2
    print(f"each budget's three runs: {again} - {first}; N_opt from the parabola through them under {first} | "
          f"{again} | their mean")
    for model, runs in table.groupby("model"):
        minima = {which: [] for which in (first, again, "mean")}
        for budget, at in runs.groupby("budget"):
            for which, found in minima.items():
                found.append((budget, isoflop_minimum(at.n_params, at[which])))
            print(f"{model} at {budget:.3g}: {' '.join(f'{d:+.4f}' for d in at.difference)}; N_opt "
                  + " | ".join(vertex(m) for m in (found[-1][1] for found in minima.values())))
        print(f"{model}: N_opt's exponent " + " | ".join(exponent(found) for found in minima.values()))
    for budget, at in table.groupby("budget"):
        print(f"at {budget:.3g}: seed sd {seed_sd(at.difference)}")
    print(f"seed sd from all pairs: {seed_sd(table.difference)}")


if __name__ == "__main__":
    main()
