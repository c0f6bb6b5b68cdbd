"""Where a stage finds Prefect: its home (this checkout's own) and its server.

Prefect's ephemeral server starts anew in every stage process; a running `prefect server` (`lmpipe server`,
lmpipe_cli/server.py) is started once (the difference per stage: benchmarks/overhead.py, docs/benchmarks.md).
Stages use PREFECT_API_URL when set, else a server at 127.0.0.1:4200 when one answers, else Prefect's ephemeral
server (the fallback).
"""

from __future__ import annotations

import contextlib
import os
import urllib.request
from pathlib import Path
from typing import Iterator

from lmpipe.paths import CACHE

HOST, PORT = "127.0.0.1", 4200


def project_home(root: str | Path = ".") -> Path:
    """The Prefect home of the checkout at `root`: its database (the server's runs, deployments and schedules) and
    settings, in the checkout's ignored cache folder. Prefect's default, ~/.prefect, is one for every checkout on
    the machine, so one project's server, runs and schedules would be another's."""
    return Path(root).resolve() / CACHE / "prefect"


def use_project_home(environ=os.environ, root: str | Path = ".") -> str:
    """PREFECT_HOME in `environ` (as the user set it, else the checkout's own), set before Prefect reads its
    settings: processes started from here inherit it, a retrain's temporary copy too. Prefect creates its home
    but not the folders above it, which a fresh clone lacks."""
    if "PREFECT_HOME" not in environ:
        home = project_home(root)
        with contextlib.suppress(OSError):  # a read-only place: Prefect's own warning says so
            home.mkdir(parents=True, exist_ok=True)
        environ["PREFECT_HOME"] = str(home)
    return environ["PREFECT_HOME"]


def api_url(port: int = PORT) -> str:
    return f"http://{HOST}:{port}/api"


def healthy(url: str, timeout: float = 0.5) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout) as response:
            return response.status == 200
    except OSError:
        return False


def running_server() -> str | None:
    """The Prefect API this process should use: PREFECT_API_URL when set, else a local server that answers."""
    if os.environ.get("PREFECT_API_URL"):
        return os.environ["PREFECT_API_URL"]
    return api_url() if healthy(api_url()) else None


@contextlib.contextmanager
def on_running_server() -> Iterator[str | None]:
    """Run this block's flows on `running_server()`, else on Prefect's ephemeral server. Prefect reads its settings
    once, at import, so the choice goes in as temporary settings at run time: importing `flows` opens no socket."""
    url = running_server()
    if url is None or os.environ.get("PREFECT_API_URL"):
        yield url
        return
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: url}):
        yield url
