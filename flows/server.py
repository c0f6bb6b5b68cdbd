"""One long-lived local Prefect server that every stage process reuses.

Prefect's ephemeral server starts anew in every stage process; a running `prefect server` is started once (the
difference per stage: benchmarks/overhead.py, docs/benchmarks.md). Stages use PREFECT_API_URL when set, else a
server at 127.0.0.1:4200 when one answers, else Prefect's ephemeral server (the fallback).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Iterator

from lmpipe.errors import LmpipeError
from lmpipe.paths import CACHE

HOST, PORT = "127.0.0.1", 4200


def this_environment() -> dict:
    """os.environ with this interpreter's environment first on PATH: the tools a command starts (dvc, mlflow,
    uvicorn) run in it even when the venv is not activated."""
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


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


APP = "flows.server:trusted_app"  # what `start` serves
TRUSTED_HOSTS = [HOST, "localhost"]


def trusted_app():
    """Prefect's server app (API, UI, background services), answering only requests addressed to this machine's
    loopback names: a page on another site that resolves its own name to 127.0.0.1 (DNS rebinding) sends its own
    Host header and is refused (400) before Prefect sees it. Prefect has no such setting of its own."""
    from prefect.server.api.server import create_app
    from starlette.middleware.trustedhost import TrustedHostMiddleware

    app = create_app(final=True)
    app.add_middleware(TrustedHostMiddleware, allowed_hosts=TRUSTED_HOSTS)
    return app


def server_env(port: int, database: str | None = None) -> dict:
    """The environment of the project's Prefect server: no telemetry, and trust only its own pages. Prefect allows
    every origin by default (CORS `*`) with no login, so any web page the user visits could create flow runs of a
    served deployment (a retrain with arbitrary overrides); here only the server's own UI origin may call it from a
    browser. Another page's JSON call needs a preflight, which the server refuses, and a body it may send without one
    (text/plain) is not JSON to Prefect's API, which refuses it. Prefect's own clients send no Origin: unaffected."""
    origin = f"http://{HOST}:{port}"
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_UI_ENABLED": os.environ.get("PREFECT_UI_ENABLED", "true"),
           "PREFECT_UI_API_URL": f"{origin}/api",  # the UI reads this server, not 4200's
           "PREFECT_SERVER_CORS_ALLOWED_ORIGINS": origin}
    env.pop("PREFECT_API_URL", None)
    if database:  # e.g. a team's PostgreSQL (flows/team.py); else Prefect's own SQLite
        env["PREFECT_API_DATABASE_CONNECTION_URL"] = database
    return env


def start(port: int = PORT, log_dir: str | Path = CACHE, timeout: float = 120,
          database: str | None = None) -> tuple[str, subprocess.Popen | None]:
    """Start the project's Prefect server in the background (unless one already answers) and wait until healthy:
    Prefect's own app (API, UI and its services, as `prefect server start` runs it) behind `trusted_app`'s host
    check, on `database` (a SQLAlchemy URL) where given."""
    url = api_url(port)
    if healthy(url):
        return url, None
    if not port_free(port):
        raise LmpipeError(f"{HOST}:{port} is taken by another program (choose another: lmpipe server --port N)")
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    env = server_env(port, database)
    with open(log_dir / f"prefect-server-{port}.log", "ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "--factory", APP, "--host", HOST, "--port", str(port),
             "--log-level", "warning", "--no-access-log"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True,
        )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if healthy(url):
            (log_dir / f"prefect-server-{port}.pid").write_text(str(process.pid))
            return url, process
        if process.poll() is not None:
            raise LmpipeError(f"prefect server exited with code {process.returncode}; see {log_dir}/prefect-server-{port}.log")
        time.sleep(0.5)
    process.terminate()
    raise LmpipeError(f"prefect server did not answer on {url} within {timeout:.0f} s; see {log_dir}/prefect-server-{port}.log")


def port_free(port: int) -> bool:
    """Whether a server could bind `port` now: as servers bind (SO_REUSEADDR), so that the closing connections of a
    server just stopped (TIME_WAIT) do not count as a server."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((HOST, port))
        except OSError:
            return False
    return True


def stop(port: int = PORT, log_dir: str | Path = CACHE) -> bool:
    """Stop a server `start` started from this checkout (found by its pid file). A copied checkout carries the pid
    file of its original's server: a pid whose process is not a Prefect server running in this directory is left
    alone, and its stale file removed."""
    pid_file = Path(log_dir) / f"prefect-server-{port}.pid"
    if not pid_file.exists():
        return False
    pid = int(pid_file.read_text())
    pid_file.unlink()
    if not started_here(pid):
        return False
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    return True


def stop_group(process: subprocess.Popen, first: int = signal.SIGTERM, patience: float = 3.0) -> None:
    """Stop a child started with its own process group (`start_new_session=True`), every process in it: `first`,
    then SIGKILL when it has not exited within `patience` seconds."""
    for sig, wait in ((first, patience), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break
        try:
            process.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # what outlived its leader (a server's workers)


def started_here(pid: int, root: Path | None = None) -> bool:
    """Whether `pid` is the project's Prefect server (`start`'s command, or a `prefect server` an older version
    started) whose working directory is this checkout (Linux /proc; where /proc is missing, the pid file is
    trusted)."""
    if not Path("/proc/self").exists():
        return True
    proc = Path(f"/proc/{pid}")
    try:
        command = proc.joinpath("cmdline").read_bytes().split(b"\0")
        cwd = proc.joinpath("cwd").resolve(strict=True)
    except OSError:
        return False
    ours = APP.encode() in command or (b"prefect" in b" ".join(command) and b"server" in command)
    return ours and cwd == (root or Path.cwd()).resolve()
