"""Where Prefect runs a flow's tasks: local threads, or a Dask or Ray cluster (`orchestration` in params.yaml).
How work is spread, never what it computes: the results are the same on every runner."""

from __future__ import annotations

import os

from lmpipe.config import OrchestrationParams
from lmpipe.errors import ConfigError


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
