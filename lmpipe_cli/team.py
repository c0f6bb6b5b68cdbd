"""A team's servers on one machine (`lmpipe team up` / `lmpipe team down`): a PostgreSQL cluster in a folder of the
project's, an MLflow server on it that serves its artifacts, a Prefect server on it, and a shared folder for a DVC
remote. Teammates point their clones at them with the environment lines `up` prints (docs/scale-out.md).

Everything lives under one folder (default `.team/`, ignored by git): postgres/ (the cluster, owned by the
`postgres` user when run as root, as PostgreSQL refuses to run as root), artifacts/, dvc-remote/, logs/ and
team.json (ports, pids and the database password; readable by its owner only). Each server answers its health check
before `up` returns; `down` stops them by the pids recorded there and waits until they have exited and their ports
are free.
"""

from __future__ import annotations

import glob
import json
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from lmpipe_cli import server
from lmpipe.errors import LmpipeError

ROOT = Path(".team")
HOST = server.HOST
PORTS = {"postgres": 5433, "mlflow": 5000, "prefect": 4300}  # 4300: beside a study's own `lmpipe server` on 4200
DATABASES = ("mlflow", "prefect")
USER = "lmpipe"  # the cluster's superuser; its password is made once, in team.json
WAIT = 180  # seconds a server may take to answer (MLflow's and Prefect's first start migrates their schemas)


@dataclass
class Team:
    root: str
    ports: dict
    password: str
    pids: dict

    def database(self, name: str, driver: str = "postgresql") -> str:
        return f"{driver}://{USER}:{self.password}@{HOST}:{self.ports['postgres']}/{name}"

    @property
    def mlflow_url(self) -> str:
        return f"http://{HOST}:{self.ports['mlflow']}"

    @property
    def prefect_url(self) -> str:
        return server.api_url(self.ports["prefect"])

    @property
    def remote(self) -> Path:
        return Path(self.root) / "dvc-remote"

    def exports(self) -> list[str]:
        """What a teammate's shell runs so that every stage, `lmpipe ui` aside, uses these servers and remote."""
        return [f"export MLFLOW_TRACKING_URI={self.mlflow_url}", f"export PREFECT_API_URL={self.prefect_url}",
                f"dvc remote add --local --force -d team {self.remote.resolve()}"]


def postgres_bin(tool: str) -> str:
    """A PostgreSQL server program: on PATH, else Debian's /usr/lib/postgresql/<version>/bin (not on PATH there)."""
    found = shutil.which(tool) or next(iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{tool}"), reverse=True)), None)
    if not found:
        raise LmpipeError(f"no PostgreSQL server program `{tool}` found: install PostgreSQL (Debian: apt install "
                          f"postgresql-15) or put its bin folder on PATH")
    return found


def _as_owner(command: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: as root, run its programs as the `postgres` user."""
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


def _state(root: Path) -> Path:
    return root / "team.json"


def load(root: Path = ROOT) -> Team | None:
    path = _state(root)
    return Team(**json.loads(path.read_text())) if path.exists() else None


def _save(team: Team) -> None:
    path = _state(Path(team.root))
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(team), indent=1))
    tmp.chmod(0o600)  # it holds the database password
    tmp.replace(path)


def alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _wait_gone(group: int, patience: float = 30) -> bool:
    """Whether every process of the process group `group` has exited within `patience` seconds."""
    deadline = time.monotonic() + patience
    while True:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)


def _wait_free(port: int, patience: float = 30) -> bool:
    deadline = time.monotonic() + patience
    while not server.port_free(port):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def postmaster(team: Team) -> int | None:
    """The pid of the cluster's server when it runs (PostgreSQL's own record of it, postmaster.pid)."""
    try:
        pid = int((Path(team.root) / "postgres" / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return pid if alive(pid) else None


def start_postgres(team: Team) -> int:
    """Initialise the cluster once (password login only, TCP on the loopback only), start it, create the databases."""
    data = Path(team.root) / "postgres"
    fresh = not (data / "PG_VERSION").exists()
    if fresh:
        data.mkdir(parents=True, exist_ok=True)
        password_file = Path(team.root) / "logs" / ".pw"
        password_file.write_text(team.password)
        if os.geteuid() == 0:
            try:
                owner = pwd.getpwnam("postgres")
            except KeyError:
                raise LmpipeError("running as root, and there is no `postgres` user to run PostgreSQL as (PostgreSQL "
                                  "refuses root): run `lmpipe team up` as another user") from None
            for path in (data, password_file, Path(team.root) / "logs"):
                os.chown(path, owner.pw_uid, owner.pw_gid)
            if subprocess.run(_as_owner(["test", "-w", str(data.resolve())])).returncode:
                raise LmpipeError(f"{data.resolve()}: the `postgres` user, whom PostgreSQL runs as under root, cannot "
                                  "reach it (a parent folder is closed to other users): choose a --dir it can reach, "
                                  "e.g. under /srv, or run `lmpipe team up` as another user")
        data.chmod(0o700)
        try:
            _run(_as_owner([postgres_bin("initdb"), "-D", str(data.resolve()), "-U", USER,
                            f"--pwfile={password_file.resolve()}", "--auth=scram-sha-256", "-E", "UTF8",
                            "--locale=C.UTF-8"]), "initdb")
        finally:
            password_file.unlink()
    log = (Path(team.root) / "logs" / "postgres.log").resolve()
    pid = postmaster(team)
    if pid is None:  # else a cluster left running by an `up` that failed later: used as it is
        _run(_as_owner([postgres_bin("pg_ctl"), "-D", str(data.resolve()), "-l", str(log), "-w", "-t", str(WAIT),
                        "-o", f"-p {team.ports['postgres']} -c listen_addresses={HOST} -c unix_socket_directories=''",
                        "start"]), f"PostgreSQL (its log: {log})")
        pid = postmaster(team)
    try:
        import psycopg2
    except ImportError:
        raise LmpipeError("MLflow's PostgreSQL driver is not installed: pip install -c constraints.txt -e '.[team]'") from None

    con = psycopg2.connect(team.database("postgres"))
    con.autocommit = True  # CREATE DATABASE runs outside a transaction
    try:
        with con.cursor() as cur:
            for name in DATABASES:
                cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
                if cur.fetchone() is None:
                    cur.execute(f'CREATE DATABASE "{name}"')
    finally:
        con.close()
    return pid


def _run(command: list[str], what: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise LmpipeError(f"{what} failed: {last[0]}")


def start_mlflow(team: Team) -> int:
    """`mlflow server` on the team's database, serving the artifacts it stores in artifacts/ (clients upload and
    download through it, so they need no access to that folder)."""
    log = Path(team.root) / "logs" / "mlflow.log"
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    env.pop("MLFLOW_TRACKING_URI", None)
    with open(log, "ab") as out:  # the server keeps its own copy of the handle
        process = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", team.database("mlflow"),
             "--artifacts-destination", str((Path(team.root) / "artifacts").resolve()), "--host", HOST,
             "--port", str(team.ports["mlflow"]), "--workers", "1"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    deadline = time.monotonic() + WAIT
    while not server.healthy(team.mlflow_url):
        if process.poll() is not None or time.monotonic() > deadline:
            server.stop_group(process)
            raise LmpipeError(f"the MLflow server did not answer on {team.mlflow_url}; see {log}")
        time.sleep(0.5)
    return process.pid


def up(root: Path = ROOT, ports: dict | None = None) -> Team:
    """Start the team's three servers (those not already running) and record them in team.json."""
    team = load(root)
    if team is None:
        team = Team(str(root), {**PORTS, **(ports or {})}, secrets.token_urlsafe(18), {})
    elif ports and any(team.ports[k] != v for k, v in ports.items()):
        raise LmpipeError(f"{_state(root)}: the team's servers use ports {team.ports}; stop them (lmpipe team down) "
                          "and remove that file's ports to change them")
    running = {name: alive(team.pids.get(name)) for name in PORTS} | {"postgres": postmaster(team) is not None}
    for name, port in team.ports.items():
        if not running[name] and not server.port_free(port):
            raise LmpipeError(f"{HOST}:{port} is taken by another program (choose another: lmpipe team up "
                              f"--{name}-port N)")
    if not running["postgres"]:
        postgres_bin("initdb")  # missing PostgreSQL: said before anything is made
    (root / "logs").mkdir(parents=True, exist_ok=True)
    team.remote.mkdir(exist_ok=True)
    if not _state(root).exists():
        _save(team)  # the password before the cluster that is made with it
    for name, start in (("postgres", start_postgres), ("mlflow", start_mlflow), ("prefect", _start_prefect)):
        if not running[name]:
            team.pids[name] = start(team)
            _save(team)
    return team


def _start_prefect(team: Team) -> int:
    _, process = server.start(team.ports["prefect"], Path(team.root) / "logs", WAIT,
                              database=team.database("prefect", "postgresql+asyncpg"))
    return process.pid


def down(root: Path = ROOT) -> list[str]:
    """Stop the team's servers by their recorded pids, Prefect and MLflow first, and wait until each has exited and
    its port is free. Returns what was stopped."""
    team = load(root)
    if team is None:
        return []
    stopped = []
    for name in ("prefect", "mlflow"):
        pid = team.pids.pop(name, None)
        if alive(pid):
            try:
                os.killpg(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            if not _wait_gone(pid):  # the server and its workers, not just its port
                os.killpg(pid, signal.SIGKILL)
                _wait_gone(pid, 10)
            stopped.append(name)
    (Path(team.root) / "logs" / f"prefect-server-{team.ports['prefect']}.pid").unlink(missing_ok=True)
    data = Path(team.root) / "postgres"
    team.pids.pop("postgres", None)
    if postmaster(team):
        _run(_as_owner([postgres_bin("pg_ctl"), "-D", str(data.resolve()), "-m", "fast", "-w", "stop"]),
             "stopping PostgreSQL")
        stopped.append("postgres")
    _save(team)
    for name, port in team.ports.items():
        if not _wait_free(port):
            raise LmpipeError(f"{HOST}:{port} ({name}) is still taken after `lmpipe team down`")
    return stopped
