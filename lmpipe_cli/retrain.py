"""The scheduled `retrain` flow. A retrain is a DVC experiment, so only a passing gate changes what users read.

1. The corpus source is fetched again into a scratch folder; a new dump is pinned as `corpus.sha256=<its hash>`.
2. `dvc exp run --temp` runs the study in a temporary copy: DVC re-runs exactly the stages that the new corpus (or the
   settings given with -S key=value) change, and every model it retrains registers a new `challenger` version in MLflow.
3. The gate compares each model's test word perplexity and bpb with its champion's (the n-gram's with HEAD's).
   - Fail: the experiment stays for `dvc exp show` / `dvc exp diff`; HEAD, the workspace and the champions are as
     they were; the flow run ends Failed, naming the regressed models and by how much.
   - Pass: `dvc exp apply`, one git commit of what the experiment changed, `dvc push` when a DVC remote is set, and
     the experiment's versions become the champions. When the workspace changed while it ran (HEAD moved, a tracked
     file edited, a new file where the experiment writes), nothing is applied: the user's work stays exactly as it
     is, and the experiment stays for `dvc exp apply <name>`.
The retrain's MLflow parent run carries the comparison table and the decision as tags.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
from collections import deque
from datetime import datetime, timezone
from pathlib import Path
from typing import NamedTuple

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact

from lmpipe import paths
from lmpipe_cli import server
from flows._stage import PARAMS_FILE, main, settings_argv, sigterm_as_ctrl_c, signals_held
from lmpipe_cli.progress import STARTED  # DVC's line as it starts a stage
from flows.study import stage_env, dvc, one_study
from lmpipe import tracking
from lmpipe.compare import changed, compare_eval, comparison_markdown, describe, metrics_of
from lmpipe.config import load_params
from lmpipe.overrides import check_overrides
from lmpipe.corpus.sources import corpus_sha256, fetch_corpus
from lmpipe.errors import ConfigError, LmpipeError, first_few, first_line
from lmpipe.git import git, git_or_empty
from lmpipe.params_file import edit_params

DECISION, EXPERIMENT, COMPARISON = "lmpipe.retrain.decision", "lmpipe.retrain.experiment", "lmpipe.retrain.comparison"
REGRESSED, COMMIT = "lmpipe.retrain.regressed", "lmpipe.retrain.commit"


def uncommitted() -> list[str]:
    """Tracked files changed but not committed: a retrain commits on top of HEAD, so it starts from a clean one."""
    return [line[3:] for line in git("status", "--porcelain", "--untracked-files=no").splitlines()]


def reproduction_outputs() -> set[str]:
    """The tracked files `dvc repro` itself writes: dvc.lock and every output git holds (`cache: false`)."""
    from dvc.repo import Repo

    with Repo() as repo:
        return {"dvc.lock", *(str(out.fs_path.removeprefix(repo.root_dir + os.sep)) for stage in repo.index.stages
                              for out in stage.outs if not out.use_cache)}


def refusal(dirty: list[str]) -> str:
    """Why a retrain does not start on a changed tree, and the command that fixes it: one short line however many
    files changed (the first few named, the rest counted)."""
    shown = first_few(dirty)
    written = reproduction_outputs()
    if not all(any(f == w or f.startswith(w + "/") for w in written) for f in dirty):
        return (f"uncommitted changes to {shown}: a retrain commits its outcome on top of HEAD; commit or stash them "
                "first")
    files = " ".join(dirty)  # every tracked change is one of them: past a few, the commands take them all
    keep, drop = ((f"git commit -m 'Study reproduced here' -- {files}", f"git checkout -- {files}") if len(dirty) <= 4
                  else ("git commit -am 'Study reproduced here'", "git checkout -- ."))
    return (f"uncommitted changes to {shown}, all of them what `dvc repro` writes (a study reproduced here whose "
            f"numbers rounded otherwise, or a run left uncommitted): keep them with `{keep}`, or drop them with "
            f"`{drop}`; a retrain commits its outcome on top of HEAD")


def refused(dirty: list[str]):
    """How a retrain on a changed tree ends: Failed, the refusal its one-line message, its schedule paused. A state,
    not a raise, so that the log holds that line and no traceback; `lmpipe retrain` says it as its error."""
    from prefect.states import Failed

    line = refusal(dirty) + pause_this_schedule()
    return Failed(message=line, data=LmpipeError(line))


def schedule_command(deployment) -> str:
    """The `lmpipe schedule` command that serves `deployment` (Prefect's) on its schedule: started again, it
    unpauses it."""
    when = ""
    for item in deployment.schedules:
        if getattr(item.schedule, "cron", None):
            when = f" --cron '{item.schedule.cron}'"
        elif getattr(item.schedule, "interval", None):
            when = f" --interval {item.schedule.interval.total_seconds():g}"
    return f"lmpipe schedule{when} --name {deployment.name}"


def pause_this_schedule() -> str:
    """Pause the deployment this retrain runs under, if any, so that it fails once, not at every firing; the words
    that say so and the command that resumes it."""
    from prefect import runtime
    from prefect.client.orchestration import get_client

    if not runtime.deployment.id:
        return ""
    with get_client(sync_client=True) as client:
        client.pause_deployment(runtime.deployment.id)
        command = schedule_command(client.read_deployment(runtime.deployment.id))
    return f"; the schedule is paused: once settled, restart `{command}` to resume it"


def paused_firing():
    """A Cancelled state for a firing of a schedule that an earlier firing paused (the runner may have taken it
    before the pause), or None: a paused schedule fires no more."""
    from prefect import runtime
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelled

    if not runtime.deployment.id:
        return None
    with get_client(sync_client=True) as client:
        deployment = client.read_deployment(runtime.deployment.id)
    return Cancelled(message=f"skipped: the schedule is paused (an earlier firing says why); restart "
                             f"`{schedule_command(deployment)}` to resume it") if deployment.paused else None


def fetched_sha256(corpus) -> str | None:
    """The source's corpus as it is now, pinned the way `corpus.sha256` pins it (fetched into a scratch folder)."""
    Path(paths.CACHE_DIR).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=paths.CACHE_DIR, prefix="retrain-fetch-") as scratch:
        fetch_corpus(corpus.model_copy(update={"sha256": None}), Path(scratch) / "raw", Path(scratch) / "downloads")
        return corpus_sha256(Path(scratch) / "raw")


def experiment_ref(name: str) -> str:
    """The git ref DVC keeps the experiment under (refs/exps/../<baseline>/<name>)."""
    refs = [r for r in git("for-each-ref", "--format=%(refname)", "refs/exps").split() if r.endswith(f"/{name}")]
    if not refs:
        raise LmpipeError(f"dvc exp run left no experiment named {name} (see: dvc exp show)")
    return refs[0]


def commit_message(name: str, rows: list[dict], max_regression: float) -> str:
    moved = changed(rows)
    head = (f"retrain {name}: {', '.join(r['model'] for r in moved)} retrained within "
            f"retrain.max_regression={max_regression:g}" if moved else f"retrain {name}: no model's numbers changed")
    return "\n".join([head, "", *(f"- {describe(r)}" for r in moved)]) + "\n"


def written_by(ref: str) -> list[str]:
    """The tracked files the experiment at `ref` changes: what applying it writes and commits."""
    return git("diff", "--name-only", "-z", "HEAD", ref).split("\0")[:-1]


class Workspace(NamedTuple):
    """The workspace as a retrain found it: a clean tree at `head`, beside these untracked (not ignored) files."""
    head: str
    untracked: frozenset[str]


def workspace_now() -> Workspace:
    return Workspace(git("rev-parse", "HEAD").strip(),
                     frozenset(git("ls-files", "--others", "--exclude-standard", "-z").split("\0")[:-1]))


def workspace_changes(start: Workspace, written: list[str]) -> list[str]:
    """What changed since `start` that applying would take: `dvc exp apply` writes over the tracked files (keeping
    the user's version only in a hidden stash that the next apply overwrites) and the commit takes what it finds, so
    a moved HEAD, any edited tracked file, or a new file among or beside the experiment's files stops the apply."""
    now = workspace_now()
    moved = [f"HEAD (moved from {start.head[:12]} to {now.head[:12]})"] if now.head != start.head else []
    folders = {str(Path(f).parent) for f in written} - {"."}
    new = sorted(f for f in now.untracked - start.untracked
                 if f in written or any(f.startswith(folder + "/") for folder in folders))
    return moved + uncommitted() + new


def apply(name: str, ref: str, message: str, overrides: list[str], env: dict) -> str:
    """The experiment into the workspace and into one commit (pushed to the DVC remote when there is one). params.yaml
    gets only the changed values, written into HEAD's text where they stand (DVC's own copy rewraps the whole file)."""
    files = written_by(ref)
    before = git("show", f"HEAD:{PARAMS_FILE}")
    dvc(["exp", "apply", name], env)
    if overrides:
        try:
            edited = edit_params(before, overrides)
        except ConfigError:
            edited = None  # a change ruamel cannot place: DVC's rewrite, which holds the same settings
        if edited is not None and yaml_equal(edited, Path(PARAMS_FILE).read_text(encoding="utf-8")):
            Path(PARAMS_FILE).write_text(edited, encoding="utf-8")
    git("add", "--", *files)
    identity = [] if git_identity() else ["-c", "user.name=lmpipe retrain", "-c", "user.email=lmpipe@localhost"]
    git(*identity, "commit", "-q", "-m", message)
    if dvc(["remote", "list"], env).strip():
        dvc(["push"], env)
    return git("rev-parse", "HEAD").strip()


def yaml_equal(a: str, b: str) -> bool:
    import yaml

    return yaml.safe_load(a) == yaml.safe_load(b)


EXPERIMENT_SCRATCH = Path(".dvc/tmp/exps")  # `dvc exp run --temp`: its copy (standalone/tmp*) and run info (run/*)


def experiment_scratch() -> set[Path]:
    return {*EXPERIMENT_SCRATCH.glob("tmp*"), *EXPERIMENT_SCRATCH.glob("standalone/tmp*"),
            *EXPERIMENT_SCRATCH.glob("run/*")}
EPOCH = re.compile(r"(\S+ epoch \d+\.\d+/[\d.]+ .*\S)")  # the trainer's line per evaluation: '<model> epoch 1.50/4.47 ...'


def progress(line: str) -> str | None:
    """The retrain's progress from a line DVC or a stage printed: the stage DVC is on, a model's epoch; else None."""
    if stage := STARTED.search(line):
        return f"stage {stage.group(1)}"
    if epoch := EPOCH.search(line):
        return epoch.group(1)
    return None


def remove_leftovers() -> list[Path]:
    """Remove what `dvc exp run --temp` left in .dvc/tmp/exps/: called under the study lock, when no retrain runs,
    so anything there is a killed retrain's (its copy and run info); the paths removed."""
    found = sorted(experiment_scratch())
    for left in found:
        shutil.rmtree(left, ignore_errors=True) if left.is_dir() else left.unlink(missing_ok=True)
    return found


def run_experiment(name: str, sets: list[str], env: dict) -> None:
    """`dvc exp run --temp`, saying as it goes which stage runs and each model's epochs. Stopped (Ctrl-C, SIGTERM,
    the flow's timeout), it stops DVC and the stage it runs and removes the temporary copy DVC leaves behind."""
    log = get_run_logger()
    for left in remove_leftovers():
        log.warning("removed %s, which a retrain stopped by force (SIGKILL) left behind", left)
    scratch = experiment_scratch()
    command = ["dvc", "exp", "run", "--temp", "--name", name, *[a for s in sets for a in ("-S", s)]]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               errors="replace", start_new_session=True,  # its own group: stopped as one, below
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # even where ignored
    tail: deque[str] = deque(maxlen=20)
    try:
        for chunk in process.stdout:
            for line in chunk.replace("\r", "\n").splitlines():
                if line.strip():
                    tail.append(line.strip())
                if said := progress(line):
                    log.info("retrain %s: %s", name, said)
        code = process.wait()
    except BaseException:  # SIGINT to DVC and its stage (each closes its runs and keeps its checkpoint)
        with signals_held():
            server.stop_group(process, signal.SIGINT, patience=60)
            remove_new_scratch(scratch)  # a stopped run may leave its copy and run info
        raise
    if code != 0:
        remove_new_scratch(scratch)  # so may a failed one; a finished one cleans up after itself
        reason = next((line for line in reversed(tail) if line.startswith(("ERROR", "error"))), tail[-1] if tail else "")
        raise LmpipeError(f"dvc exp run failed (exit {code}): {reason}")


def remove_new_scratch(before: set[Path]) -> None:
    for left in experiment_scratch() - before:
        shutil.rmtree(left, ignore_errors=True) if left.is_dir() else left.unlink(missing_ok=True)


def git_identity() -> bool:
    """Whether git has an author to commit as (a retrain that passes commits)."""
    return bool(git_or_empty("config", "user.email"))


RESUME = "run the same `lmpipe retrain` again: DVC's run cache restores every stage that finished"


@flow(name="retrain")
def retrain(overrides: list[str] | None = None) -> dict:
    """Retrain what a refreshed corpus (or `overrides`, e.g. models.gru.optim.lr=0.003) changes, as a DVC experiment;
    apply and commit it, and promote its models, only when no model regressed beyond retrain.max_regression.
    Every outcome ends in one line: nothing to retrain, applied (the commit and the champions), or regressed.
    Stopped (Ctrl-C or SIGTERM: Cancelled; the deployment's timeout: Failed), its MLflow run ends KILLED and the
    line says how to resume. Passed while the workspace changed, it applies nothing and says how to apply it later.
    Refused on a changed tree, it pauses its schedule; a firing the runner had already taken then ends Cancelled."""
    sigterm_as_ctrl_c()  # SIGTERM takes Ctrl-C's path below, not Prefect's crash
    params = load_params(PARAMS_FILE)
    check_overrides(PARAMS_FILE, overrides)  # a typo in an override stops here, before DVC deletes anything
    if skipped := paused_firing():
        return skipped
    with one_study():
        dirty = uncommitted()
        if dirty:
            return refused(dirty)
        start = workspace_now()  # applied only onto this: a user's work done meanwhile is never overwritten
        if said := tracking.runs.end_ghost_runs(params.tracking.experiment, "lmpipe retrain"):
            get_run_logger().info(said)
        parent = tracking.runs.start_study_run(params.tracking.experiment, PARAMS_FILE, "retrain")
        try:
            outcome = gated_retrain(params, parent, list(overrides or []), start)
        except (KeyboardInterrupt, TimeoutError) as exc:  # Ctrl-C, or SIGTERM (flows/_stage), or the timeout
            return stopped(parent, exc)
    print(outcome.pop("said"), flush=True)
    return outcome


def stopped(parent: str, exc: BaseException):
    """A stopped retrain's record: its MLflow run KILLED with the decision, and a Cancelled state (Ctrl-C, SIGTERM)
    or a RetrainStopped (the timeout), each saying how to resume."""
    from prefect.states import Cancelled

    reason = "interrupted" if isinstance(exc, KeyboardInterrupt) else "timed out"
    with signals_held():
        tracking.set_tags(parent, {DECISION: "interrupted", "lmpipe.retrain.reason": reason})
        tracking.runs.end_study_run(parent, "KILLED")
    line = f"retrain {reason}: nothing is applied and no temporary copy is left; {RESUME}"
    if isinstance(exc, TimeoutError):
        raise RetrainStopped(line) from None
    return Cancelled(message=line)


NOT_APPLIED = "passed, not applied: workspace changed"


def gated_retrain(params, parent: str, sets: list[str], start: Workspace) -> dict:
    """The retrain's steps: refetch, `dvc exp run --temp`, the gate, then apply, refuse, or leave the experiment when
    the workspace changed since `start`. Returns the outcome with the closing line to say (`said`); a regression is
    an LmpipeError naming the models."""
    limit, log = params.retrain.max_regression, get_run_logger()
    env = {**stage_env(parent), "LMPIPE_CACHE_DIR": str(Path(paths.CACHE_DIR).resolve())}  # checkpoints outlive the copy
    log.info("retrain: fetching the corpus source again")
    pinned = fetched_sha256(params.corpus)
    if pinned != corpus_sha256(paths.RAW):
        log.info("retrain: the source has a new corpus (sha256 %s)", pinned)
        sets.append(f"corpus.sha256={pinned}")
    if not sets and not json.loads(dvc(["status", "--json", "dvc.yaml"], env) or "{}"):
        tracking.set_tags(parent, {DECISION: "unchanged"})
        create_markdown_artifact("# Retraining\n\nThe corpus and the pipeline are unchanged: nothing to retrain.\n",
                                 key="retrain-comparison", description="nothing changed")
        return {"decision": "unchanged", "said": "nothing to retrain: the corpus source and the pipeline are "
                f"unchanged since {git('rev-parse', '--short', 'HEAD').strip()}"}
    name = f"retrain-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}"
    tracking.set_tags(parent, {EXPERIMENT: name})
    log.info("retrain %s: dvc exp run --temp %s", name, " ".join(f"-S {s}" for s in sets))
    try:  # the plan first, as `lmpipe plan` gives it; no plan is no reason to stop
        from lmpipe_cli.plan import plan

        log.info("retrain %s: %s", name, plan(sets).replace("\n", "; "))
    except Exception as exc:
        log.info("retrain %s: no plan (%s)", name, first_line(str(exc)))
    run_experiment(name, sets, env)
    ref = experiment_ref(name)
    head = json.loads(Path(paths.EVAL).read_text()) if Path(paths.EVAL).exists() else None
    before = {**metrics_of(head), **tracking.registry.champion_metrics(params.models)}
    rows, regressed = compare_eval(before, metrics_of(json.loads(git("show", f"{ref}:{paths.EVAL}"))), limit)
    table = comparison_markdown(rows, regressed, limit)
    create_markdown_artifact(table, key="retrain-comparison", description="test metrics, champion vs challenger")
    tracking.set_tags(parent, {DECISION: "failed" if regressed else "passed", COMPARISON: table,
                               REGRESSED: ",".join(regressed)})
    if regressed:
        raise LmpipeError(f"{name} regressed beyond retrain.max_regression={limit:g}: "
                          + "; ".join(describe(r) for r in rows if r["model"] in regressed)
                          + f"; nothing applied (inspect it: dvc exp show, dvc exp diff HEAD {name})")
    if changes := workspace_changes(start, written_by(ref)):
        tracking.set_tags(parent, {DECISION: NOT_APPLIED})
        shown = first_few(changes)
        return {"decision": NOT_APPLIED, "experiment": name, "rows": rows, "said": (
            f"{name} passed but is not applied: {shown} changed while it ran, and those changes stay as they are; "
            f"the experiment stays: once they are committed or stashed, `dvc exp apply {name}` and a commit apply it")}
    commit = apply(name, ref, commit_message(name, rows, limit), sets, env)
    champions = tracking.registry.promote_experiment(name)
    tracking.set_tags(parent, {COMMIT: commit})
    moved = changed(rows)
    said = (f"applied {name} as commit {commit[:12]}; champions: "
            + (", ".join(f"{m.removeprefix('lmpipe-')} v{v}" for m, v in sorted(champions.items())) or "unchanged")
            + ("; " + "; ".join(describe(r) for r in moved) if moved else "; no model's numbers changed"))
    return {"decision": "passed", "experiment": name, "commit": commit, "rows": rows, "champions": champions,
            "said": said}


class RetrainStopped(LmpipeError):
    """A retrain stopped by its timeout, cleaned up: one line, how to resume (Ctrl-C and SIGTERM end Cancelled)."""


retrain.interrupted = f"error: retrain interrupted; {RESUME}"  # flows/_stage.main's line, where the flow could not say it


if __name__ == "__main__":
    main(retrain, overrides=settings_argv("a setting for the experiment, as dvc exp run -S takes it"))
