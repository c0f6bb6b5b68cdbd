"""Run a module as `python -m` does, recording every side effect it has: each file it writes, moves or removes, each
folder it makes and SQLite database it opens, each write to the MLflow tracking store and model registry, and each
change to the process's environment and signal handlers, with the project file that made it (the innermost project
frame on the stack: the code a reader must open to see the effect). Writes from C (torch.save's zip writer,
SQLite's pages) are not seen; the database they go to is.

    python tests/effects.py RECORD.json -m flows.train --model gru

tests/test_walk.py follows a stage's effects with it, not its imports. The record is a JSON list of
{"kind": "file" | "dir" | "run" | "registry" | "env" | "signal", "what": <the audit event, or the store method>,
"target": <path, run id, model name, variable or signal>, "by": <project file>}.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import runpy
import signal
import sys
import threading
from pathlib import Path

ROOT = Path.cwd().resolve()
TRACKING_WRITE = re.compile(r"(create|log|set|update|delete|restore|rename|record|finalize)_")
REGISTRY_WRITE = re.compile(r"(create|set|update|delete|rename)_")
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_inside = threading.local()  # a store method's own calls to its other methods are one effect
effects: list[dict] = []


def writer() -> str:
    """The innermost frame's file in the project (this file left out): where the effect is made, as a reader sees it."""
    frame = sys._getframe(2)
    while frame is not None:
        path = frame.f_code.co_filename
        if path.startswith(str(ROOT)) and "/.venv/" not in path and not path.endswith("tests/effects.py"):
            return Path(path).relative_to(ROOT).as_posix()
        frame = frame.f_back
    return "(none)"  # a library's own thread, e.g. MLflow's system-metrics sampler


def in_project(path) -> str | None:
    try:
        resolved = Path(os.fsdecode(path)).resolve() if not isinstance(path, int) else None
    except (TypeError, ValueError):
        return None
    if resolved is None or not resolved.is_relative_to(ROOT):
        return None
    return resolved.relative_to(ROOT).as_posix()


def audit(event: str, args: tuple) -> None:
    if getattr(_inside, "busy", False):
        return
    if event in ("os.putenv", "os.unsetenv"):  # os.environ's writes: the process's environment
        effects.append({"kind": "env", "what": event, "target": os.fsdecode(args[0]), "by": writer()})
        return
    kind = "dir" if event == "os.mkdir" else "file"
    if event == "open":
        path, mode, flags = args
        writes = any(c in mode for c in "wax+") if isinstance(mode, str) else bool((flags or 0) & WRITE_FLAGS)
        targets = [path] if writes else []
    elif event == "os.rename":  # os.replace too
        targets = [args[1]] if args[3] in (None, -1) else []
    elif event in ("os.remove", "os.rmdir"):
        targets = [args[0]] if args[1] in (None, -1) else []  # a name under a folder's fd: a step of an rmtree, noted whole
    elif event == "shutil.rmtree":
        targets = [args[0]]
    elif event == "os.mkdir":
        targets = [args[0]] if args[2] in (None, -1) else []
    elif event == "sqlite3.connect":  # a database the process writes from C
        targets = [args[0]] if isinstance(args[0], (str, bytes, os.PathLike)) and args[0] != ":memory:" else []
    else:
        return
    for target in targets:
        _inside.busy = True
        try:
            where = in_project(target)
            if where is not None and "__pycache__" not in where:
                effects.append({"kind": kind, "what": event, "target": where, "by": writer()})
        finally:
            _inside.busy = False


def record_store(cls, kind: str, pattern) -> None:
    """Wrap each public writing method of an MLflow store class to note its calls."""
    for name in [n for n in vars(cls) if pattern.match(n) and callable(getattr(cls, n))]:
        method = getattr(cls, name)

        def wrapped(self, *args, _method=method, _name=name, **kwargs):
            if getattr(_inside, "store", False):
                return _method(self, *args, **kwargs)
            by = writer()
            _inside.store = True
            try:
                out = _method(self, *args, **kwargs)
            finally:
                _inside.store = False
            target = kwargs.get("run_id") or kwargs.get("name") or (args[0] if args else None)
            if _name == "create_run":
                target = out.info.run_id
            effects.append({"kind": kind, "what": _name, "target": str(target), "by": by})
            return out

        setattr(cls, name, wrapped)


def record_signals() -> None:
    """Note each signal handler set (no audit event says so)."""
    set_handler = signal.signal

    def recorded(signum, handler):
        effects.append({"kind": "signal", "what": "signal.signal", "target": signal.Signals(signum).name,
                        "by": writer()})
        return set_handler(signum, handler)

    signal.signal = recorded


def save(record: str) -> None:
    Path(record).write_text(json.dumps(effects, indent=1))


if __name__ == "__main__":
    record, flag, module, *rest = sys.argv[1:]
    assert flag == "-m", "usage: python tests/effects.py RECORD.json -m MODULE [ARGS...]"
    from mlflow.store.model_registry.sqlalchemy_store import SqlAlchemyStore as Registry
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore as Tracking

    record_store(Tracking, "run", TRACKING_WRITE)
    record_store(Registry, "registry", REGISTRY_WRITE)
    record_signals()
    atexit.register(save, str(Path(record).resolve()))
    sys.addaudithook(audit)
    sys.argv = [module, *rest]
    sys.path[0] = str(ROOT)
    runpy.run_module(module, run_name="__main__", alter_sys=True)
