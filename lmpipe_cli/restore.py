"""`lmpipe restore <stage>`: bring back a stage's outputs that DVC removed before a run that failed.

It decides first and changes nothing unless the whole restore can be done: a restore that rewrote dvc.lock to a run
whose files this machine does not have would leave the stage with no outputs at all, and one that replaced an output
no cache or commit holds would lose it. `python -m lmpipe_cli.restore <stage>` says what it would do and changes nothing
(exit 0 only where it would bring outputs back): a failing stage asks it before it recommends `lmpipe restore`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from lmpipe_cli.server import this_environment
from lmpipe import dvc_files
from lmpipe.errors import LmpipeError, first_line
from lmpipe.git import git, git_or_empty

WORKSPACE, LOCK, HEAD = "workspace", "lock", "head"  # where a stage's outputs come from


@dataclass
class Plan:
    """What a restore of one stage does: its `source` (None: nothing can be restored), the `line` that says so, the
    outputs it brings back (`cached` from DVC's cache, `tracked` from git's HEAD) and, from HEAD, the lock `entry`
    it writes back."""

    stage: str
    source: str | None
    line: str
    cached: list[str] = field(default_factory=list)
    tracked: list[str] = field(default_factory=list)
    entry: dict | None = None
    lock_file: str = "dvc.lock"


def plan(stage: str) -> list[Plan]:
    """How each stage that `stage` names would be restored, decided before anything changes: the workspace already
    as dvc.lock records it (nothing to do); else the run dvc.lock records, where DVC's cache holds its cached outputs
    (this machine's run, committed or not) and its git-held outputs (`cache: false`: metrics, plots) are in the
    workspace unchanged or in HEAD's commit; else HEAD's run, where the cache holds its outputs; else nothing. No
    source may replace an output that differs from it: that file may be the only copy."""
    from dvc.exceptions import DvcException
    from dvc.repo import Repo

    try:
        repo = Repo(".")
        stages = repo.stage.collect(stage)
    except DvcException as exc:
        raise LmpipeError(f"{stage}: not a stage of this project ({first_line(str(exc))}); see: dvc stage list") from None
    plans = []
    for s in stages:
        lock_file = os.path.relpath(s.dvcfile.path, repo.root_dir).removesuffix(".yaml") + ".lock"
        ours = dvc_files.locked_stages(Path(lock_file).read_text(encoding="utf-8")) if os.path.exists(lock_file) else {}
        head = dvc_files.locked_stages(git_or_empty("show", f"HEAD:{lock_file}") or "")
        plans.append(_decide(_Outputs(repo, s), s.addressing, ours.get(s.name), head.get(s.name), lock_file))
    return plans


class _Outputs:
    """A stage's outputs as DVC sees them: where each is, whether DVC's cache holds a recorded version of it, and
    whether the workspace holds that version."""

    def __init__(self, repo, stage):
        self.repo, self.outs = repo, {o.def_path: o for o in stage.outs}
        self.wdir = stage.wdir

    def path(self, name: str) -> str:
        return os.path.relpath(self.outs[name].fs_path, self.repo.root_dir)

    def cached(self, name: str) -> bool:
        return self.outs[name].use_cache

    def exists(self, name: str) -> bool:
        return self.outs[name].exists

    def _odb(self, recorded: dict):
        return self.repo.cache.local if recorded.get("hash") == "md5" else self.repo.cache.legacy

    def in_cache(self, recorded: dict) -> bool:
        """Whether DVC's cache holds the version `recorded` (a lock entry's out): a file's object, or a folder's
        listing and every file in it."""
        from dvc_data.hashfile.hash_info import HashInfo
        from dvc_data.hashfile.tree import Tree

        odb, value = self._odb(recorded), recorded.get("md5")
        if not value:
            return False
        if not value.endswith(".dir"):
            return odb.exists(value)
        try:
            tree = Tree.load(odb, HashInfo(odb.hash_name, value))
        except (OSError, ValueError):
            return False
        return all(odb.exists(info.value) for _, _, info in tree)

    def holds(self, name: str, recorded: dict) -> bool:
        """Whether the workspace's `name` is the version `recorded`, hashed as DVC hashes it (nothing is written)."""
        from dvc_data.hashfile.build import build

        out, odb = self.outs[name], self._odb(recorded)
        try:
            _, _, obj = build(odb, out.fs_path, out.fs, odb.hash_name, ignore=out.dvcignore, dry_run=True)
        except OSError:
            return False
        return obj.hash_info.value == recorded.get("md5")


def _recorded(entry: dict | None) -> dict:
    return {o["path"]: o for o in (entry or {}).get("outs", [])}


def _decide(outs: _Outputs, stage: str, ours: dict | None, head: dict | None, lock_file: str) -> Plan:
    names = list(outs.outs)
    mine, theirs = _recorded(ours), _recorded(head)
    present = {n: outs.exists(n) for n in names}
    holds_mine = {n: present[n] and n in mine and outs.holds(n, mine[n]) for n in names}
    if ours is not None and all(holds_mine.values()):
        return Plan(stage, WORKSPACE, f"nothing to restore: {stage}'s outputs are as {lock_file} records them",
                    lock_file=lock_file)

    def shortfall(recorded: dict, holds: dict, who: str) -> str:
        """Why the run `recorded` (its outs) cannot come back whole without replacing anything; '' where it can."""
        def listed(paths: list[str], singular: str, plural: str) -> str:
            return f"{', '.join(paths)} {singular if len(paths) == 1 else plural}"

        if absent := [outs.path(n) for n in names if n not in recorded]:
            return f"{who} has no {', '.join(absent)}"
        if changed := [outs.path(n) for n in names if present[n] and not holds[n]]:
            return listed(changed, f"differs from {who} and would be replaced", f"differ from {who} and would be replaced")
        if uncached := [outs.path(n) for n in names
                        if outs.cached(n) and not present[n] and not outs.in_cache(recorded[n])]:
            return listed(uncached, f"of {who} is not in this cache", f"of {who} are not in this cache")
        if lost := [outs.path(n) for n in names if not outs.cached(n) and not present[n]
                    and (theirs.get(n) or {}).get("md5") != recorded[n].get("md5")]:
            return listed(lost, f"of {who} is in no commit", f"of {who} are in no commit")
        return ""

    missing = [n for n in names if not present[n]]
    cached = [outs.path(n) for n in missing if outs.cached(n)]
    tracked = [outs.path(n) for n in missing if not outs.cached(n)]
    lock_says = shortfall(mine, holds_mine, f"the run {lock_file} records") if ours else f"{lock_file} records no run of it"
    if not lock_says:
        return Plan(stage, LOCK, f"restored {stage} from the run {lock_file} records", cached, tracked,
                    lock_file=lock_file)
    holds_head = {n: present[n] and n in theirs and outs.holds(n, theirs[n]) for n in names}
    head_says = shortfall(theirs, holds_head, "HEAD's run") if head else f"HEAD's {lock_file} records no run of it"
    if not head_says:
        return Plan(stage, HEAD, f"restored {stage} from the commit (HEAD): the run {lock_file} recorded since was "
                                 f"not committed, and its metrics never were", cached, tracked, head, lock_file)
    fixes = []
    if head and "not in this cache" in head_says:
        fixes.append(f"`dvc pull {stage}` fetches HEAD's from a DVC remote that has them")
    if any(present[n] and not holds_mine[n] and not holds_head[n] for n in names):  # files no run records
        fixes.append(f"keep this machine's outputs: `dvc commit {stage}`, then git commit")
    else:
        fixes.append(f"`dvc repro -s {stage}` makes them again")
    why = head_says if ours == head else f"{head_says}, and {lock_says}"
    return Plan(stage, None, f"{stage}: nothing restored, nothing changed: {why}; {', or '.join(fixes)}",
                lock_file=lock_file)


def restore(stage: str) -> str:
    """A stage's outputs from one source, never a mix (`plan`): the outputs DVC keeps come from its cache
    (`dvc checkout`), the ones git holds (`cache: false`: metrics, plots) from HEAD. Nothing changes unless every
    stage named can be restored whole. Returns the line that says what came back."""
    from dvc.utils.serialize import modify_yaml

    plans = plan(stage)
    refused = [p for p in plans if p.source is None]
    if refused:
        raise LmpipeError("; ".join(p.line for p in refused))
    lines = []
    for p in plans:
        if p.source == WORKSPACE:
            lines.append(p.line)
            continue
        if p.source == HEAD:
            with modify_yaml(p.lock_file) as lock:  # DVC's own reader and writer: the file keeps its form
                lock.setdefault("stages", {})[p.stage.rpartition(":")[2]] = p.entry
        if p.cached and subprocess.call(["dvc", "checkout", "--force", "--quiet", p.stage],
                                        env=this_environment()) != 0:
            raise LmpipeError(f"dvc checkout {p.stage} failed: see dvc checkout {p.stage}")
        if p.tracked:
            git("checkout", "HEAD", "--", *p.tracked)  # a failure: one line, git's reason
        lines.append(f"{p.line}: {', '.join(p.cached + p.tracked)}")
    return "; ".join(lines)


if __name__ == "__main__":
    try:
        found = plan(sys.argv[1])
    except (LmpipeError, IndexError) as exc:
        sys.exit(f"error: {exc}")
    for p in found:
        print(p.line)
    sys.exit(0 if found and all(p.source in (LOCK, HEAD, WORKSPACE) for p in found)
             and any(p.source in (LOCK, HEAD) for p in found) else 1)
