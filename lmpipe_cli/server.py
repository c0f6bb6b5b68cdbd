"""`lmpipe server`: one long-lived local Prefect server that every stage process reuses (where a stage looks for it:
flows/_prefect.py), served behind checks of Host and of other sites' requests; and the process helpers the other
tools share (this venv's environment, free ports, stopping a process group)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

from flows._prefect import HOST, PORT, api_url, healthy, use_project_home
from lmpipe.errors import LmpipeError
from lmpipe.paths import CACHE


def this_environment() -> dict:
    """os.environ with this interpreter's environment first on PATH: the tools a command starts (dvc, mlflow,
    uvicorn) run in it even when the venv is not activated."""
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


APP = "lmpipe_cli.server:trusted_app"  # what `start` serves
TRUSTED_HOSTS = [HOST, "localhost"]


SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
OTHER_SITES = frozenset({"cross-site", "same-site"})  # Sec-Fetch-Site of a request another site's page made


def own_origins(environ=os.environ) -> frozenset[str]:
    """The origins of the server's own pages: its loopback names at the port of the UI's API (server_env)."""
    port = urllib.parse.urlsplit(environ.get("PREFECT_UI_API_URL") or api_url()).port or PORT
    return frozenset(f"http://{host}:{port}" for host in TRUSTED_HOSTS)


class OwnPagesOnly:
    """Refuses (403) a request that changes state (any method but GET, HEAD, OPTIONS; a websocket) made by another
    site's page through the user's browser. CORS only keeps such a page from reading the answer: a form's POST or a
    text/plain one needs no preflight and reaches Prefect, which acts on it (pause or resume a schedule). Browsers
    name the page's origin (Origin) and how it relates to this server (Sec-Fetch-Site); Prefect's own clients send
    neither, and its UI, served here, sends its own origin."""

    def __init__(self, app, origins: frozenset[str]):
        self.app, self.origins = app, origins

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket" or (scope["type"] == "http" and scope["method"] not in SAFE_METHODS):
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
            origin = headers.get("origin")
            if (origin is not None and origin not in self.origins) or headers.get("sec-fetch-site") in OTHER_SITES:
                await self.refuse(scope, send)
                return
        await self.app(scope, receive, send)

    @staticmethod
    async def refuse(scope, send) -> None:
        if scope["type"] == "websocket":  # closed before it is accepted: the server answers the handshake 403
            await send({"type": "websocket.close", "code": 1008})
            return
        body = b'{"detail": "refused: a page of another site may not change what this server holds"}'
        await send({"type": "http.response.start", "status": 403,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def trusted_app():
    """Prefect's server app (API, UI, background services), answering only requests addressed to this machine's
    loopback names, and changing state only for its own pages and for clients that are not browsers. A page on
    another site that resolves its own name to 127.0.0.1 (DNS rebinding) sends its own Host header and is refused
    (400); a page that sends a request to 127.0.0.1 itself is refused (403, OwnPagesOnly) before Prefect sees it.
    Prefect has no such setting of its own."""
    from prefect.server.api.server import create_app
    from starlette.middleware.trustedhost import TrustedHostMiddleware

    app = create_app(final=True)
    app.add_middleware(OwnPagesOnly, origins=own_origins())
    app.add_middleware(TrustedHostMiddleware, allowed_hosts=TRUSTED_HOSTS)  # the outer one: the Host first
    return app


def server_env(port: int, database: str | None = None) -> dict:
    """The environment of the project's Prefect server: no telemetry, the checkout's own Prefect home, and trust
    only its own pages. Prefect allows every origin by default (CORS `*`) with no login, so any web page the user
    visits could create flow runs of a served deployment (a retrain with arbitrary overrides); here only the
    server's own UI origin may call it from a browser (CORS), and what a page may send without a preflight is
    refused by `trusted_app`. Prefect's own clients send no Origin: unaffected."""
    origin = f"http://{HOST}:{port}"
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_UI_ENABLED": os.environ.get("PREFECT_UI_ENABLED", "true"),
           "PREFECT_UI_API_URL": f"{origin}/api",  # the UI reads this server, not 4200's
           "PREFECT_SERVER_CORS_ALLOWED_ORIGINS": origin}
    env.pop("PREFECT_API_URL", None)
    use_project_home(env)
    if database:  # e.g. a team's PostgreSQL (lmpipe_cli/team.py); else Prefect's own SQLite
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
