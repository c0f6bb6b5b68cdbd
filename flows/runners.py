"""Where Prefect runs a flow's tasks: local threads, or a Dask or Ray cluster (`orchestration` in params.yaml).
How work is spread, never what it computes: the results are the same on every runner. A local cluster's workers
train one thread each (Dask's and Ray's workers start with OMP_NUM_THREADS=1): one worker per core."""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from collections.abc import Sequence

import click
from prefect import flow
from prefect.futures import as_completed

from lmpipe.config import OrchestrationParams
from lmpipe.errors import ConfigError, LmpipeError


def task_runner(settings: OrchestrationParams):
    """Prefect's task runner for the parallel training: a Dask or Ray cluster at `address`, else a local one."""
    if settings.task_runner == "dask":
        from prefect_dask import DaskTaskRunner

        if settings.address:
            return DaskTaskRunner(address=settings.address)
        return DaskTaskRunner(cluster_class="distributed.LocalCluster", cluster_kwargs={
            "n_workers": settings.workers, "threads_per_worker": 1, "processes": True,
            "host": "127.0.0.1", "dashboard_address": None})
    try:
        from prefect_ray import RayTaskRunner
    except ImportError:
        raise ConfigError("orchestration.task_runner 'ray' needs prefect-ray: pip install -c constraints.txt "
                          "-e '.[ray]' (or use 'dask')") from None
    if settings.address:
        return RayTaskRunner(address=settings.address)
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # local-only Ray: it stays on 127.0.0.1
    return RayTaskRunner(init_kwargs={"num_cpus": settings.workers, "include_dashboard": False})


def in_project(cwd: str | None):
    """A task's working directory: the project's, which a cluster's worker (started elsewhere) must see at the same
    path, as the study's train stages do; None leaves it as it is (the flow's own process)."""
    return contextlib.nullcontext() if cwd is None else contextlib.chdir(cwd)


def run_apart(run, calls: Sequence[dict], groups: Sequence[str], settings: OrchestrationParams, per_group: int,
              name: str) -> list:
    """Independent runs of the task `run`, one per `calls` (its keyword arguments): in the flow's own process one
    after another (`sequential`), else side by side on the task runner of `settings` (`in_parallel`). Each call's
    result in the order of `calls`, or the exception it raised: a failed run costs no other its result."""
    if settings.task_runner != "sequential":
        return in_parallel(run, calls, groups, task_runner(settings), per_group, name)
    outcomes = []
    for call in calls:
        try:
            outcomes.append(run(**call))
        except Exception as exc:
            outcomes.append(exc)
    return outcomes


def in_parallel(run, calls: Sequence[dict], groups: Sequence[str], runner, per_group: int, name: str) -> list:
    """`run_apart` on the Prefect task runner `runner`, in a subflow `name`: each run submitted as a worker frees up,
    but never more than `per_group` of one group (e.g. a family's runs, whose newest unfinished checkpoints alone are
    kept) at a time, each group's in the order given; every run is waited for, whichever fails."""
    here = os.getcwd()

    @flow(name=name, task_runner=runner, validate_parameters=False)
    def apart() -> list:
        outcomes, waiting, running, busy = [None] * len(calls), list(range(len(calls))), {}, Counter()
        while waiting or running:
            for i in list(waiting):
                if busy[groups[i]] < per_group:
                    running[run.submit(**calls[i], cwd=here)] = i
                    busy[groups[i]] += 1
                    waiting.remove(i)
            future = next(as_completed(list(running)))
            i = running.pop(future)
            busy[groups[i]] -= 1
            try:
                outcomes[i] = future.result()
            except Exception as exc:
                outcomes[i] = exc
        return outcomes

    return apart()


def results(names: Sequence[str], outcomes: Sequence, what: str) -> list:
    """`run_apart`'s outcomes when every run succeeded; else each failed run named, and one error for them all."""
    failed = [(name, o) for name, o in zip(names, outcomes) if isinstance(o, BaseException)]
    for name, error in failed:
        print(f"{name}: failed: {error}", flush=True)
    if failed:
        name, error = failed[0]
        raise LmpipeError(f"{len(failed)} of {len(names)} {what} failed, the first {name}: {error} (the other runs' "
                          "rows are cached: a rerun trains only the failed)")
    return list(outcomes)


def spread_options(function):
    """The flags of `lmpipe scaling` and `lmpipe seeds` (and of their flows run as scripts) that spread their runs for
    one call, in place of params.yaml's `orchestration` (which a stage's report tracks whole, so editing it re-makes
    the report)."""
    function = click.option("--address", metavar="URL", help="train on the workers of a running cluster: a Dask "
                            "scheduler (tcp://host:8786) or a Ray cluster (ray://host:10001)")(function)
    return click.option("--workers", type=click.IntRange(min=1), metavar="N", help="train N runs side by side on a "
                        "local Dask cluster of N one-thread workers (one a core)")(function)


def flags(workers: int | None, address: str | None) -> list[str]:
    """The flags of `spread_options` for these values, to pass on to a flow's command line."""
    return [*(["--workers", str(workers)] if workers is not None else []), *(["--address", address] if address else [])]


def orchestration_with(settings: OrchestrationParams, workers: int | None = None,
                       address: str | None = None) -> OrchestrationParams:
    """`settings` with the flags' values: a cluster at `address` (Ray for ray://, else Dask), or a local Dask one of
    `workers`; neither: `settings` as they are."""
    if address:
        return settings.model_copy(update={"task_runner": "ray" if address.startswith("ray://") else "dask",
                                           "address": address})
    if workers is not None:
        if workers < 1:
            raise ConfigError(f"--workers {workers}: at least 1")
        return settings.model_copy(update={"task_runner": "dask", "address": None, "workers": workers})
    return settings
