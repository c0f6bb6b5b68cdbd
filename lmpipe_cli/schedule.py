"""`lmpipe schedule`: serve the retrain flow as a Prefect deployment on a cron or interval schedule; this process
is the worker, and stops (with the retrain it runs) on Ctrl-C or SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal

from lmpipe_cli import server
from lmpipe.errors import LmpipeError


def check_cron(cron: str) -> None:
    from prefect.client.schemas.schedules import CronSchedule
    from pydantic import ValidationError

    try:
        CronSchedule(cron=cron)
    except ValidationError:
        raise LmpipeError(f'--cron {cron!r}: not a cron expression (five fields: minute hour day-of-month month '
                          'day-of-week, e.g. "0 3 * * 1" for Mondays 03:00)') from None


def serve_schedule(name: str, cron: str | None = None, interval: float | None = None) -> int:
    """Serve the retrain deployment on the project's Prefect server. Prefect reads PREFECT_API_URL once, when it is
    first imported, so the server is settled before anything imports Prefect: a temporary server cannot schedule."""
    ours = not os.environ.get("PREFECT_API_URL")
    if ours:
        os.environ["PREFECT_API_URL"] = server.api_url()
    if cron:
        check_cron(cron)  # imports Prefect, which now reads the server's URL
    if ours:
        if server.start()[1]:
            print(f"started the project's Prefect server: {server.api_url()} (stop it with: lmpipe server --stop)",
                  flush=True)
    elif not server.healthy(os.environ["PREFECT_API_URL"], timeout=5):
        raise LmpipeError(f"PREFECT_API_URL={os.environ['PREFECT_API_URL']} does not answer: a schedule needs a "
                          "running Prefect server (start one: lmpipe server, or unset PREFECT_API_URL)")
    from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy
    from prefect.runner import Runner

    from lmpipe_cli.retrain import retrain
    from lmpipe.config import load_params

    timeout = load_params().retrain.timeout
    when = f"cron '{cron}'" if cron else f"every {interval:g} s"
    print(f"serving deployment 'retrain/{name}' on {when} via {os.environ['PREFECT_API_URL']}"
          f" (one retrain at a time, a firing during one is cancelled; each may run {timeout:g} s; Ctrl-C stops it)",
          flush=True)
    runner = Runner(name=name, pause_on_shutdown=True)  # what Flow.serve builds
    runner.add_flow(retrain.with_options(timeout_seconds=timeout), name=name, cron=cron, interval=interval,
                    paused=False, concurrency_limit=ConcurrencyLimitConfig(
                        limit=1, collision_strategy=ConcurrencyLimitStrategy.CANCEL_NEW))
    # Prefect's own SIGTERM handler stops polling but leaves a running retrain training: SIGTERM (systemd,
    # supervisord, Docker) does what Ctrl-C does instead, which stops the retrain, its DVC run and its copy
    runner.handle_sigterm = as_ctrl_c
    # started with SIGINT ignored (nohup, a background job of a script), the retrain Prefect spawns would inherit
    # that and shrug off as_ctrl_c's SIGINT: Python's Ctrl-C handler here, so a spawned child starts with its own
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        asyncio.run(runner.start())
    except (KeyboardInterrupt, SystemExit):  # Ctrl-C, or SIGTERM through as_ctrl_c
        pass
    print(f"stopped serving 'retrain/{name}'", flush=True)
    return 0


def as_ctrl_c(signum=None, frame=None) -> None:
    """SIGTERM as the terminal's Ctrl-C: SIGINT to the other processes of this one's group (a retrain Prefect runs),
    then to this one, whose handler (asyncio's, while the runner runs) cancels the runner cleanly."""
    import psutil

    group = os.getpgrp()
    for child in psutil.Process().children(recursive=True):
        try:
            if os.getpgid(child.pid) == group:
                child.send_signal(signal.SIGINT)
        except (psutil.Error, ProcessLookupError):
            continue
    signal.raise_signal(signal.SIGINT)
