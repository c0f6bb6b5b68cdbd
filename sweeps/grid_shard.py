"""Train a share of the scaling grid's points into its row cache, so that a machine's cores train several at once.

`lmpipe scaling` trains one point after another, each a small model that keeps few threads busy (the committed
rows were trained one thread a run). On an n-core machine, start n shards of one thread each, then let `lmpipe
scaling` assemble the grid from the rows they cached (it trains whatever is still missing, and commits the frozen
stage):

    OMP_NUM_THREADS=1 PYTHONPATH=. python sweeps/grid_shard.py 0/2 &
    sleep 30; OMP_NUM_THREADS=1 PYTHONPATH=. python sweeps/grid_shard.py 1/2 &
    wait; lmpipe scaling

Shard k of n takes every n-th point of the grid's own order, from the k-th, that has no cached row yet, each a child
of the grid's MLflow run (start the second shard once the first has opened it); n at most 3, as a family keeps 3
unfinished runs' checkpoints side by side. A killed shard resumes from its checkpoint when started again.
PYTHONPATH=. so that the checkout's own code is trained and keyed. --dry-run lists the shard's points and trains
nothing.
"""

from __future__ import annotations

import argparse
import sys

from flows._stage import PARAMS_FILE
from flows.scaling import ROWS, grid_run, plan, row_key, train_point
from lmpipe.checkpoints import KEEP
from lmpipe.config import load_params
from lmpipe.splits import load_tokens
from lmpipe.train.job import row_file


def parse_shard(shard: str) -> tuple[int, int]:
    """'k/n' -> (k, n), or exit with what it must be."""
    try:
        k, n = (int(v) for v in shard.split("/"))
    except ValueError:
        k, n = -1, 0
    if not 0 <= k < n <= KEEP:
        sys.exit(f"shard {shard}: k/n, where k counts from 0 to n - 1, and n is at most {KEEP} (the unfinished runs "
                 "of a family kept side by side: lmpipe.checkpoints.KEEP)")
    return k, n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shard", help="k/n: this shard's number k (from 0) of n")
    parser.add_argument("--dry-run", action="store_true", help="list the shard's points, train nothing")
    args = parser.parse_args()
    k, n = parse_shard(args.shard)
    params, data = load_params(PARAMS_FILE), load_tokens()
    points, jobs = plan(params, data)
    mine = [(p, job) for i, (p, job) in enumerate(zip(points, jobs))  # the grid's own order, so shards never overlap
            if i % n == k and not row_file(ROWS, p.name, row_key(job)).exists()]
    print(f"shard {k}/{n}: {len(mine)} points without a cached row", flush=True)
    if args.dry_run:
        return print("\n".join(p.name for p, _ in mine))
    with grid_run(params, data) as parent:
        for point, job in mine:
            train_point.fn(point, job, params, parent.info.run_id)


if __name__ == "__main__":
    main()
