"""Carry the committed scaling-grid rows over to changed training code, after checking that it reproduces them.

A grid row is cached under a key that hashes the training code (lmpipe.checkpoints.run_key), so any edit to that
code, even one that changes no number, makes `lmpipe scaling` retrain all ~100 rows (12.5 h on the 2-core CPU). This
retrains the cheapest committed row of each model in each CSV (or the rows named) with the code as it is now and
compares their valid bpb with the CSV: bit for bit, or within --tolerance bpb (another CPU rounds differently: 1e-8
to 1e-4 bpb between a Zen 3 and a Zen 5, sweeps/notes.md). A check row is kept in the row cache under today's key,
as `lmpipe scaling` keeps a row, so --export commits it; a committed row of today's key that replaced a row of
another key (the same name in an earlier CSV) is that earlier CSV's check, made already: the checks of one machine
carry to the next with the rows, and the grid's carry can be spread over days. For each model in each CSV whose
check row holds, it writes each of those committed rows of the grid (params.yaml's `scaling`) into the row cache
under the current key, marked `carried_from` with its old cache file and `carried_within` with the difference
measured; rows whose check differs by more are not carried. A committed row whose cache file already names
today's key was made by this very code, params and data (another day's or machine's run of them): it is carried as
it is, with no check, and marked `same_key` instead of `carried_within`. Then `lmpipe scaling` trains only the
points no carried row holds. --export writes the rows trained here (cached, not carried: the grid's and the
checks') as a CSV to commit beside the others. From the checkout's root:

    OMP_NUM_THREADS=1 PYTHONPATH=. python sweeps/reuse_grid_rows.py sweeps/grid_*.csv [--tolerance 1e-4] [--workers 2]
    PYTHONPATH=. python sweeps/reuse_grid_rows.py --dry-run                         # what a carry would train
    PYTHONPATH=. python sweeps/reuse_grid_rows.py --export sweeps/grid_<date>.csv   # the rows the CSVs lack

One thread, as the rows were trained; PYTHONPATH=. so that the checkout's own code is checked and keyed, the code
`python -m flows.scaling` runs there (a script's own folder comes first on its path, so without it Python imports
the lmpipe an editable install points at, perhaps another checkout's: refused).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

import pandas as pd
from prefect import task
from prefect.cache_policies import NO_CACHE

from flows._stage import PARAMS_FILE
from flows.runners import in_project, orchestration_with, results, run_apart
from flows.scaling import ROWS, plan, row_key, trained_row
from lmpipe import checkpoints, codebase
from lmpipe.config import OrchestrationParams, load_params
from lmpipe.errors import LmpipeError
from lmpipe.io import write_json
from lmpipe.scaling import GridPoint
from lmpipe.splits import load_tokens
from lmpipe.train.job import row_file


def at_least_one(text: str) -> int:
    """--workers N: a whole number of at least 1 (0 would train nothing side by side, yet run)."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a whole number of at least 1")
    return int(text)


def keys_of(jobs: dict) -> dict:
    """Each point's cache key, as flows.scaling computes it."""
    return {name: row_key(job) for name, job in jobs.items()}


def by_date(csvs: list[str]) -> list[str]:
    """`csvs` oldest first, by the date (and letter) in each name (grid_2026-12-07b.csv: 2026-12-07b), not
    alphabetically: grid_seeds_2026-12-01.csv came before grid_2026-12-07.csv."""
    def made(path: str) -> tuple[str, str]:
        found = re.search(r"\d{4}-\d{2}-\d{2}[a-z]?", Path(path).name)
        return (found.group() if found else "", str(path))
    return sorted(csvs, key=made)


def every_row(csvs: list[str]) -> pd.DataFrame:
    """Every committed row of `csvs`, oldest CSV first (`by_date`), with the CSV it came from."""
    return pd.concat([pd.read_csv(path).assign(source=str(path)) for path in by_date(csvs)], ignore_index=True)


def committed(csvs: list[str]) -> pd.DataFrame:
    """Every committed row, the last of each name (a re-run replaces an earlier one), with the CSV it came from."""
    return every_row(csvs).drop_duplicates("name", keep="last").set_index("name")


def replaced(csvs: list[str]) -> pd.DataFrame:
    """The committed rows a later row of the same name replaced (`committed` keeps the last), with their CSV."""
    rows = every_row(csvs)
    return rows[rows.duplicated("name", keep="last")]


def check_rows(rows: pd.DataFrame, known: list[str]) -> list[str]:
    """The cheapest of `known` (committed rows of the grid) for each model in each CSV: each CSV is a grid run of the
    code of its day, so each model's rows are checked once per CSV that holds them."""
    cheapest = {}
    for name in sorted(known, key=lambda n: -float(rows.loc[n, "train_seconds"])):
        cheapest[rows.loc[name, "model"], rows.loc[name, "source"]] = name
    return sorted(cheapest.values())


@task(cache_policy=NO_CACHE, task_run_name="check {point.name}")
def checked_bpb(point: GridPoint, job, cwd: str | None = None) -> float:
    """A check row trained with the code as it is and kept in the row cache under today's key, as `lmpipe scaling`
    keeps a row (so `--export` commits it; one trained before is read back): its valid bpb. `cwd`: the project, where
    a worker of a cluster runs it (flows.runners.in_project)."""
    with in_project(cwd):
        return job.cached(ROWS, point.name, row_key(job), lambda: trained_row(point, job)[0],
                          lambda row: None)["valid_bpb"]


def retrain(jobs: dict, points: dict, names: list[str], spread: OrchestrationParams | None) -> list[float]:
    """Each of `names` retrained (`checked_bpb`): one after another here, or side by side on the task runner of
    `spread` (one-thread workers, as the grid's runs: `--workers`), at most checkpoints.KEEP of a family at a time."""
    calls = [{"point": points[name], "job": jobs[name]} for name in names]
    if spread is None:
        return [checked_bpb.fn(**call) for call in calls]
    outcomes = run_apart(checked_bpb, calls, [points[n].model for n in names], spread, per_group=checkpoints.KEEP,
                         name="grid-checks")
    return results(names, outcomes, "check runs")


def judged(compared: list[tuple[tuple, float, float]], tolerance: float) -> dict[tuple, float]:
    """{(model, CSV): the largest difference of its compared rows ((model, CSV), now, committed)}, math.inf for a
    group one of whose rows is beyond `tolerance` (0: bit for bit)."""
    largest: dict[tuple, float] = {}
    for group, now, then in compared:
        largest[group] = max(largest.get(group, 0.0), abs(now - then) if abs(now - then) <= tolerance else math.inf)
    return largest


def check(jobs: dict, points: dict, rows: pd.DataFrame, names: list[str], tolerance: float = 0.0,
          spread: OrchestrationParams | None = None) -> dict[tuple, float]:
    """Retrain `names` with the code as it is (`retrain`): each model's rows in each CSV `judged` by their check
    rows' difference from the committed valid bpb."""
    compared = []
    for name, now in zip(names, retrain(jobs, points, names, spread)):
        then = float(rows.loc[name, "valid_bpb"])
        print(f"{name}: valid bpb {now!r} now, {then!r} committed ({now - then:+.2e})", flush=True)
        compared.append(((rows.loc[name, "model"], rows.loc[name, "source"]), now, then))
    return judged(compared, tolerance)


def checked_before(rows: pd.DataFrame, earlier: pd.DataFrame, own: list[str], tolerance: float) -> dict[tuple, float]:
    """The checks committed already: a row of today's key (`own`) that replaced a row of another key in an earlier
    CSV (`replaced`) is a rerun of it with the code as it is, so it checks that CSV's rows of its model as a check row
    does (`judged`), with no training."""
    compared = []
    for _, then in earlier[earlier["name"].isin(own)].iterrows():
        now = rows.loc[then["name"]]
        if then["cache_file"] != now["cache_file"]:
            print(f"{then['name']}: valid bpb {float(now['valid_bpb'])!r} under today's key ({now['source']}), "
                  f"{then['valid_bpb']!r} in {then['source']} ({now['valid_bpb'] - then['valid_bpb']:+.2e})",
                  flush=True)
            compared.append(((then["model"], then["source"]), float(now["valid_bpb"]), float(then["valid_bpb"])))
    return judged(compared, tolerance)


def own_rows(keys: dict, rows: pd.DataFrame) -> list[str]:
    """The committed rows made under today's key (their cache file is the one `lmpipe scaling` looks for): the same
    code, params, data and precision, so nothing to check."""
    return sorted(n for n in keys if n in rows.index and rows.loc[n, "cache_file"] == row_file(ROWS, n, keys[n]).name)


def put(rows: pd.DataFrame, name: str, key: str, **mark) -> bool:
    """A committed row written into the row cache under `key`, with its old cache file (`carried_from`) and `mark`,
    unless a row was trained there since: whether it was written."""
    done = row_file(ROWS, name, key)
    if done.exists():
        return False
    row = {k: (v.item() if hasattr(v, "item") else v) for k, v in rows.loc[name].items() if pd.notna(v) and k != "source"}
    write_json(done, {"name": name, **row, "carried_from": row.pop("cache_file"), **mark})
    return True


def carry_own(keys: dict, rows: pd.DataFrame, own: list[str]) -> int:
    """Each committed row made under today's key (`own_rows`) put into the row cache as it is, marked `same_key` (no
    check row was needed, so no difference was measured)."""
    return sum(put(rows, name, keys[name], same_key=True) for name in own)


def carry(jobs: dict, keys: dict, rows: pd.DataFrame, held: dict[tuple, float]) -> int:
    """Each committed row of a (model, CSV) in `held` (the largest difference its check rows showed) put into the
    row cache under today's key, marked `carried_within` that difference."""
    return sum(put(rows, name, keys[name], carried_within=held[group]) for name in jobs
               if name in rows.index and (group := tuple(rows.loc[name, ["model", "source"]])) in held)


def checks_to_run(keys: dict, rows: pd.DataFrame, names: list[str] | None, tolerance: float,
                  earlier: pd.DataFrame | None) -> tuple[list[str], dict[tuple, float], list[str]]:
    """What carrying needs: the committed rows made under today's keys (`own_rows`), the (model, CSV)s whose checks
    were committed already (`checked_before`, the rows of today's key that replaced `earlier` ones), and the check
    rows to train for the others (`names`, else the cheapest of each, `check_rows`)."""
    own = own_rows(keys, rows)
    before = {} if earlier is None else checked_before(rows, earlier, own, tolerance)
    unchecked = [name for name in keys if name in rows.index and name not in own
                 and (rows.loc[name, "model"], rows.loc[name, "source"]) not in before]
    return own, before, [n for n in names or check_rows(rows, unchecked) if n not in own]


def dry_run(keys: dict, rows: pd.DataFrame, names: list[str] | None, tolerance: float,
            earlier: pd.DataFrame | None) -> str:
    """The check rows a carry would train, each with its CSV and the training seconds its committed run took, and in
    one line their number and seconds in all, what needs none, and the points no committed row holds: nothing
    trained or written."""
    own, before, names = checks_to_run(keys, rows, names, tolerance, earlier)
    seconds = [float(rows.loc[n, "train_seconds"]) for n in names]
    for name, took in zip(names, seconds):
        print(f"{name}: {rows.loc[name, 'source']}, {took:,.0f} s", flush=True)
    return (f"{len(names)} check rows to train ({sum(seconds):,.0f} s of training as committed); {len(own)} rows made "
            f"under today's keys and {len(before)} models' CSVs checked by committed reruns need none; "
            f"{sum(n not in rows.index for n in keys)} points of the grid have no committed row")


def reuse(jobs: dict, points: dict, rows: pd.DataFrame, names: list[str] | None, tolerance: float,
          spread: OrchestrationParams | None = None, earlier: pd.DataFrame | None = None) -> str:
    """Carry what can be carried into the row cache, said in one line: the rows made under today's keys as they are;
    then each (model, CSV) whose checks (`checks_to_run`: committed already, else trained now) reproduce."""
    keys = keys_of(jobs)
    own, before, names = checks_to_run(keys, rows, names, tolerance, earlier)
    same = carry_own(keys, rows, own)
    judgement = {**before, **check(jobs, points, rows, names, tolerance, spread)}
    for model, source in sorted(g for g, d in judgement.items() if d == math.inf):
        print(f"{model} in {source}: the code as it is does not reproduce these rows within {tolerance:g} bpb: not "
              "carried, lmpipe scaling retrains them", flush=True)
    held = {g: d for g, d in judgement.items() if d != math.inf}
    reproduced = ", ".join(f"{m} in {c} (within {d:.1e} bpb)" for (m, c), d in sorted(held.items())) or "none"
    return (f"{same} rows made under today's keys carried as they are; reproduced: {reproduced}; "
            f"{carry(jobs, keys, rows.drop(index=own), held)} rows carried into {ROWS}; "
            f"{sum(n not in rows.index for n in jobs)} points of the grid have no committed row")


def export(out: Path, jobs: dict, keys: dict, rows: pd.DataFrame) -> None:
    """The rows of the grid trained here (cached, not carried), with their cache file, as a CSV to commit: the next
    machine carries them on as it carries the rows of the other CSVs."""
    cached = [path for n in jobs if (path := row_file(ROWS, n, keys[n])).exists()]
    new = [{**row, "cache_file": path.name} for path in cached
           if "carried_from" not in (row := json.loads(path.read_text()))]
    columns = [c for c in rows.reset_index().columns if c != "source"]
    pd.DataFrame(new, columns=columns).to_csv(out, index=False)
    print(f"{out}: {len(new)} rows", flush=True)


def main() -> None:
    if codebase.ROOT != Path.cwd().resolve():  # the code it checks and keys by is the code `lmpipe scaling` runs here
        sys.exit(f"run from the checkout whose code it checks, with PYTHONPATH=. (this imports {codebase.ROOT})")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csvs", nargs="*", default=sorted(str(p) for p in Path("sweeps").glob("grid_*.csv")))
    parser.add_argument("--names", nargs="*", default=None,
                        help="the committed rows to retrain instead: only the rows of the models and CSVs they "
                        "stand for are carried")
    parser.add_argument("--export", type=Path, default=None)
    parser.add_argument("--dry-run", action="store_true",
                        help="list the check rows a carry would train and what they took; train and write nothing")
    parser.add_argument("--tolerance", type=float, default=0.0,
                        help="largest valid-bpb difference a retrained row may show (default 0: bit for bit)")
    parser.add_argument("--workers", type=at_least_one, default=None,
                        help="retrain the check rows side by side on a local Dask cluster of N one-thread workers")
    args = parser.parse_args()
    try:
        params, data = load_params(PARAMS_FILE), load_tokens()
    except LmpipeError as exc:  # params.yaml or the tokens: the user's to fix, in one line
        sys.exit(f"error: {exc}")
    points, prepared = plan(params, data)
    jobs = {p.name: job for p, job in zip(points, prepared)}
    rows = committed(args.csvs)
    if args.export:
        return export(args.export, jobs, keys_of(jobs), rows)
    if args.dry_run:
        return print(dry_run(keys_of(jobs), rows, args.names, args.tolerance, replaced(args.csvs)), flush=True)
    spread = orchestration_with(params.orchestration, args.workers) if args.workers else None
    print(reuse(jobs, {p.name: p for p in points}, rows, args.names, args.tolerance, spread, replaced(args.csvs)),
          flush=True)


if __name__ == "__main__":
    main()
