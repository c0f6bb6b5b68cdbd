"""What every stage flow shares: tracked MLflow runs, and a `main` that turns user errors into one line."""

from __future__ import annotations

import atexit
import contextlib
import gc
import logging
import os
import shutil
import signal
import sys
import threading
from pathlib import Path
from typing import Callable, Iterator, NoReturn

import prefect
from prefect import runtime

from flows._prefect import on_running_server
from lmpipe import dvc_files, paths, tracking
from lmpipe.config import Params, load_params, params_hash
from lmpipe.paths import BASELINE
from lmpipe.errors import ConfigError, Interrupted, LmpipeError, first_line
from lmpipe.process import keep_freed_memory

PARAMS_FILE = "params.yaml"
MODEL_STAGES = ("train", "score")  # the foreach stages over `models` in dvc.yaml: <stage>@<model>


def score_stage(model: str) -> str:
    """The DVC stage that scores `model`: score@<model>, or score_ngram for the baseline (dvc.yaml)."""
    return f"score_{BASELINE}" if model == BASELINE else f"score@{model}"


def is_transient(task, task_run, state) -> bool:
    """Prefect retry condition: retry I/O hiccups, never a user mistake (404, bad checksum, bad file)."""
    try:
        state.result()
    except LmpipeError:
        return False
    except Exception:
        return True
    return False


def git_tracked_outputs(stage: str, pipeline: str = "dvc.yaml") -> list[str]:
    """The outputs of `stage` when git holds every one of them (`cache: false`), else []: such a stage's MLflow run
    is tagged with their hash and found by it (the views find the publish stage's run by metrics/models)."""
    entry = dvc_files.pipeline_stages(pipeline).get(stage) or {}
    listed = [item for kind in ("outs", "metrics", "plots") for item in entry.get(kind) or []]
    cached = [not isinstance(item, dict) or (next(iter(item.values())) or {}).get("cache", True) for item in listed]
    return [] if not listed or any(cached) else [next(iter(item)) for item in listed]


@contextlib.contextmanager
def stage_run(stage: str, params: Params, sections: list[str] | dict, model: str | None = None) -> Iterator:
    """An MLflow run for this stage with its params (section names, or the values) logged and the Prefect flow run
    linked. A stage whose outputs git holds tags its run with their hash once they are written (`run_of_output`)."""
    chosen = sections if isinstance(sections, dict) else {name: params.section(name) for name in sections}
    tags = {"prefect.flow_run_id": str(runtime.flow_run.id or ""), "prefect.flow_run_name": str(runtime.flow_run.name or "")}
    with tracking.runs.open_stage_run(stage, params.tracking.experiment, chosen, params_hash(chosen),
                                      model=model, tags=tags, params_file=PARAMS_FILE) as run:
        yield run
        outputs = git_tracked_outputs(stage) if Path("dvc.yaml").exists() else []
        if outputs:
            tracking.mark_output(outputs, run.info.run_id)


def log_report(run_id: str | None = None) -> None:
    """The study's report (reports/study.md, .html and figures/) as artifacts of a run: the report stage's own, or
    (publish) the study run's, where the MLflow UI opens."""
    for name, where in (("study.md", "report"), ("study.html", "report"), ("figures", "report/figures")):
        tracking.log_artifacts(f"{paths.REPORTS}/{name}", where, run_id=run_id)


def _user_error_names() -> set[str]:
    names, todo = set(), [LmpipeError]
    while todo:
        cls = todo.pop()
        names.add(cls.__name__)
        todo += cls.__subclasses__()
    return names


class _OneLineUserErrors(logging.Filter):
    """A user mistake is said once, as `main`'s one line: Prefect's four reports of it (task failed, task finished
    Failed, flow encountered, flow finished Failed, each repeating the message) are dropped, as are its crash reports
    of an interrupt, which `main` also says once."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], (KeyboardInterrupt, LmpipeError)):
            return False
        message = record.getMessage()
        if "aborted by an interrupt signal" in message:
            return False
        return not any(f"{name}(" in message or f"{name}: " in message for name in _user_error_names())


def _terminated(signum, frame):
    """SIGTERM (a scheduler, `kill`) ends a stage as Ctrl-C does: runs closed, checkpoint kept."""
    raise KeyboardInterrupt


def sigterm_as_ctrl_c() -> None:
    """For a flow that must stop cleanly on SIGTERM (`lmpipe retrain`'s), called first in its body: Prefect's flow
    engine swaps in its own SIGTERM handler for the run (a crash, then the signal again, past every `except
    KeyboardInterrupt`), so the flow takes `_terminated` back. Prefect puts the handler from before the run back
    when the run ends. Signals reach the main thread only: elsewhere, nothing."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminated)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """A second Ctrl-C or SIGTERM while a stopped run cleans up (stops its processes, removes its copy, closes its
    MLflow run) is ignored: a cleanup cut short leaves the residue it is there to remove."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


INTERRUPTED = ("interrupted: nothing was written to this stage's outputs; training stages keep their last "
               "checkpoint, so `dvc repro` resumes them")  # a flow with another way to resume sets `.interrupted`


def fail(line: str, restorable: bool = True) -> NoReturn:
    """Exit 1 with one line. Under DVC the stage's outputs were removed before it ran: where `lmpipe restore` can
    bring them back whole (DVC's cache and git hold them), the line says so and names it."""
    stage = os.environ.get("DVC_STAGE")
    if stage and restorable and ran_before(stage) and would_restore(stage):
        line += f" (DVC removed this stage's outputs before it ran; `lmpipe restore {stage}` brings them back)"
    sys.exit(line)


def would_restore(stage: str) -> bool:
    """Whether `lmpipe restore <stage>` would bring its outputs back, asked of `python -m lmpipe_cli.restore` (the same
    decision, in a process of its own, as the harness imports nothing of the restore); False where it cannot tell."""
    import subprocess

    try:
        done = subprocess.run([sys.executable, "-m", "lmpipe_cli.restore", stage], cwd=os.environ.get("DVC_ROOT", "."),
                              capture_output=True, timeout=120)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def ran_before(stage: str) -> bool:
    """Whether DVC's lock file records a run of `stage` ('train@gru', 'scaling/dvc.yaml:grid'): only then did it
    have outputs to remove."""
    pipeline, _, name = stage.rpartition(":")
    lock = Path(os.environ.get("DVC_ROOT", ".")) / (pipeline or "dvc.yaml").replace("dvc.yaml", "dvc.lock")
    try:
        return name in dvc_files.locked_stages(lock.read_text())
    except (OSError, dvc_files.YAMLError):
        return False


def _prog() -> str:
    """How this process was started: `python -m flows.<stage>`, or the script's name."""
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    return f"python -m {spec.name}" if spec else Path(sys.argv[0]).name


def settings_argv(what: str) -> list[str] | None:
    """The `-S KEY=VALUE` settings a flow run as a script was given (`python -m flows.study -S ...`), as `lmpipe`
    takes them; None for none. A bare key=value or --set is one line naming -S; --help is left to `main`."""
    import argparse

    from lmpipe.set_param import add_set_param, parse_args

    argv = sys.argv[1:]
    if {"-h", "--help"} & set(argv):
        return None
    parser = argparse.ArgumentParser(prog=_prog(), add_help=False)
    add_set_param(parser, what)
    return parse_args(parser, argv).overrides or None


def help_or_refuse(flow: Callable, takes_arguments: bool) -> None:
    """`--help` prints what the stage does and starts nothing; a stage that reads params.yaml alone refuses an
    argument in one line instead of ignoring it."""
    argv = sys.argv[1:]
    asked = bool({"-h", "--help"} & set(argv))
    if not asked and (takes_arguments or not argv):
        return
    prog = _prog()
    if not asked:
        fail(f"error: {prog} takes no arguments (got {' '.join(argv)}): it reads {PARAMS_FILE}; see {prog} --help")
    doc = (sys.modules["__main__"].__doc__ or flow.description or flow.name).strip()
    print(f"usage: {prog}{' [-S KEY=VALUE ...]' if takes_arguments else ''}\n\n{doc}")
    sys.exit(0)


def main(flow: Callable, **flow_kwargs) -> None:
    """Run a stage flow as a script: check params first, then run; exit 1 with one line on a user error. `--help`
    prints the stage's description and starts nothing."""
    help_or_refuse(flow, takes_arguments=bool(flow_kwargs))
    interrupted = getattr(flow, "interrupted", INTERRUPTED)  # a flow's own line (with_options below drops it)
    atexit.register(gc.freeze)  # at exit, Python's last collections then skip the million objects of Prefect, MLflow
    # and torch's modules: ~1 s less a stage (20 a study); nothing of the stage's is left to collect by then
    try:
        params = load_params(PARAMS_FILE)
        tracking.store.prepare_store(params.tracking.timeout_seconds)
    except LmpipeError as exc:
        fail(f"error: {exc}")
    keep_freed_memory()  # training and scoring re-allocate the same big buffers every step: no page faults for them
    for handler in logging.getLogger("prefect").handlers + logging.getLogger().handlers:
        handler.addFilter(_OneLineUserErrors())
    signal.signal(signal.SIGTERM, _terminated)
    if flow.flow_run_name is None:  # a flow run named after its stage, not a random pair of words
        flow = flow.with_options(flow_run_name=flow.name)
    key = tracking.runs.study_key(PARAMS_FILE)
    try:
        with on_running_server(), prefect.tags(f"commit:{key.commit[:12]}", f"study:{key}"):
            state = flow(**flow_kwargs, return_state=True)
    except Interrupted as exc:
        fail(f"{exc}; `dvc repro` resumes", restorable=False)
    except KeyboardInterrupt:
        fail(interrupted, restorable=False)
    if state.is_cancelled():  # a flow that stopped cleanly on Ctrl-C or SIGTERM: its state's message says how
        fail(f"error: {state.message}", restorable=False)
    if state.is_failed():
        exc = state.result(raise_on_failure=False)
        if isinstance(exc, LmpipeError):
            fail(f"error: {exc}")
        if line := full_disk(exc):
            fail(f"error: {line}")
        fail(f"error: stage failed: {type(exc).__name__}: {first_line(str(exc))}")


def stale_model_stages(locked: dict, models: list[str]) -> list[str]:
    """The train@ and score@ stages among a dvc.lock's `locked` ones whose model is not among `models`."""
    return [name for name in locked
            if name.partition("@")[0] in MODEL_STAGES and name.partition("@")[2] not in models]


def drop_removed(models: list[str], lock_file: str | Path = "dvc.lock") -> list[Path]:
    """What a model no longer in params.yaml left behind, gone as `dvc remove` would take it: the outputs that
    dvc.lock records for its train@ and score@ stages (the model folder, its metrics, curve, scores and
    log-probabilities), their entries in dvc.lock, the cached outputs' lines in .gitignore and its registered
    model's aliases (tracking.registry.retire); nothing else, so a file of the user's beside them stays. DVC keeps
    the outputs of a stage it no longer has, and a stale curve, metrics file or model would otherwise stay in `dvc
    plots show`, the report, git and `dvc status`. The model stays in DVC's cache. Every stage that covers all models (evaluate, combine, audit, report) calls it first: the first
    of them to run removes them, before DVC records the `models/` and `metrics/eval/` folders as dependencies."""
    gone: list[Path] = []
    if not Path(lock_file).exists() or not stale_model_stages(
            dvc_files.locked_stages(Path(lock_file).read_text(encoding="utf-8")), models):
        return gone  # the common case, read in milliseconds: DVC's round-trip reader takes seconds
    from dvc.utils.serialize import modify_yaml

    with modify_yaml(lock_file) as lock:  # DVC's own reader and writer: the file keeps its form
        stale = stale_model_stages(lock.get("stages", {}), models)
        for name in stale:
            for out in lock["stages"][name].get("outs", []):
                path = Path(out["path"])
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                elif path.exists() or path.is_symlink():
                    path.unlink()
                else:
                    continue
                gone.append(path)
                forget_ignored(path)
            del lock["stages"][name]
    if stale:
        from lmpipe.tracking.registry import retire

        retire(sorted({name.partition("@")[2] for name in stale}))
    return gone


def forget_ignored(path: Path) -> None:
    """Drop `path`'s line from the .gitignore beside it, which DVC wrote when the path became a cached output."""
    ignore = path.parent / ".gitignore"
    if ignore.exists():
        lines = ignore.read_text().splitlines(keepends=True)
        ignore.write_text("".join(line for line in lines if line.strip() != f"/{path.name}"))


def full_disk(exc: BaseException) -> str | None:
    """One line for a write that ran out of space outside lmpipe's atomic outputs (a checkpoint, a library's file):
    which path, and what to do; None for any other failure."""
    from lmpipe.io import disk_full

    full = disk_full(exc)
    return str(full) if full else None


def check_declared(families: list[str], pipeline: str, stage: str) -> None:
    """A scaling stage reads each listed family's study settings (`models.<family>`), and DVC re-runs it when they
    change only where its pipeline names them: a family it does not name is refused. So the stage depends on those
    models alone, not on the study's whole `models` (adding a model to the study leaves the grid current)."""
    declared = dvc_files.pipeline_stages(pipeline)[stage].get("params", [])
    missing = [m for m in families if f"models.{m}" not in declared]
    if missing:
        raise ConfigError(f"{PARAMS_FILE}: scaling.models lists {', '.join(missing)}, but {pipeline}'s {stage} "
                          f"does not name models.{missing[0]} in its params: add it there, so that DVC re-runs the "
                          f"{stage} when that model's settings change")
