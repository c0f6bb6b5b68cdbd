"""`lmpipe restore <stage>`: bring back a stage's outputs that DVC removed before a run that failed."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from flows.server import this_environment
from lmpipe import dvc_files
from lmpipe.errors import LmpipeError, first_line
from lmpipe.git import git, git_or_empty


def restore(stage: str) -> str:
    """A stage's outputs from one source, never a mix: the run dvc.lock records, when that run is committed (DVC's
    cache holds its cached outputs, git the ones DVC leaves to git, `cache: false`: metrics, plots); else the commit's
    run (HEAD's dvc.lock entry for the stage, which the workspace's dvc.lock then records again): an uncommitted
    run's metrics were never in git, so its model cannot come back with them. `dvc checkout` alone restores only
    the cached outputs, as the workspace's dvc.lock records them. Returns the line that says what came back."""
    from dvc.exceptions import DvcException
    from dvc.repo import Repo
    from dvc.utils.serialize import modify_yaml

    try:
        repo = Repo(".")
        stages = repo.stage.collect(stage)
    except DvcException as exc:
        raise LmpipeError(f"{stage}: not a stage of this project ({first_line(str(exc))}); see: dvc stage list") from None
    cached = [os.path.relpath(o.fs_path, repo.root_dir) for s in stages for o in s.outs if o.use_cache]
    tracked = [os.path.relpath(o.fs_path, repo.root_dir) for s in stages for o in s.outs if not o.use_cache]
    source = "the run dvc.lock records"
    if tracked:  # outputs in two places: they must come from the same run
        lock_file = os.path.relpath(stages[0].dvcfile.path, repo.root_dir).removesuffix(".yaml") + ".lock"
        names = [s.name for s in stages]
        ours = dvc_files.locked_stages(Path(lock_file).read_text(encoding="utf-8")) if os.path.exists(lock_file) else {}
        head = dvc_files.locked_stages(git_or_empty("show", f"HEAD:{lock_file}") or "")
        committed = {n: head.get(n) for n in names}
        if any(entry is None for entry in committed.values()):
            raise LmpipeError(f"{stage}: no committed run of it (HEAD's {lock_file} has none), so its "
                              f"{', '.join(tracked)} are in no git commit: make them with dvc repro -s {stage}")
        if any(ours.get(n) != entry for n, entry in committed.items()):
            with modify_yaml(lock_file) as lock:  # DVC's own reader and writer: the file keeps its form
                lock.setdefault("stages", {}).update(committed)
            source = f"the commit (HEAD): the run {lock_file} recorded since was not committed, and its metrics never were"
    if cached and subprocess.call(["dvc", "checkout", "--force", "--quiet", stage], env=this_environment()) != 0:
        raise LmpipeError(f"dvc checkout {stage} failed: its outputs are not in DVC's cache (re-run it: "
                          f"dvc repro -s {stage})")
    known = git_or_empty("ls-files", "--", *tracked).split() if tracked else []
    if known:
        git("checkout", "HEAD", "--", *tracked)  # a failure: one line, git's reason
    left = [t for t in tracked if not any(k == t or k.startswith(t.rstrip("/") + "/") for k in known)]
    return (f"restored {stage} from {source}: {', '.join(cached + [t for t in tracked if t not in left])}"
            + (f"; not in git, so not restored: {', '.join(left)} (dvc repro -s {stage} makes them)" if left else ""))
