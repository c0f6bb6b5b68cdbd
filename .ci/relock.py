"""Record the current deps of stages whose outputs are known unchanged, without their outputs on this machine.

    python .ci/relock.py STAGE [STAGE ...]        (e.g. 'train@*' 'word2vec' 'audit' seeds/dvc.yaml:seeds)

For a maintainer, after a change to code a stage depends on that is shown not to change its outputs (tests that
compare bytes, bit-for-bit runs of small models): what `dvc commit` does, for a checkout that lacks the outputs (a
fresh clone before its study, or a machine that cannot reproduce them). Each stage's code deps (files git tracks) and
params are hashed anew by DVC; its outputs stay as dvc.lock records them, and its data deps take the hashes that the
stages making them record (after `dvc commit` of a stage whose outputs changed, its readers follow). A fresh clone's
study then re-makes the same lock; tests/test_graph.py checks, with `is_code` below, that the lock is current.
"""

from __future__ import annotations

import fnmatch
import os
import subprocess
import sys

from dvc.dependency import ParamsDependency
from dvc.repo import Repo


def is_tracked(path: str) -> bool:
    return bool(subprocess.run(["git", "ls-files", "--", path], capture_output=True, text=True, check=True).stdout)


def is_code(path: str, outputs: list[str]) -> bool:
    """Whether `path` is code or settings: tracked by git, and no stage's output, inside one or holding one."""
    if any(path == out or path.startswith(out + os.sep) or out.startswith(path + os.sep) for out in outputs):
        return False
    return is_tracked(path)


def relock(patterns: list[str]) -> list[str]:
    done = []
    with Repo() as repo, repo.lock:
        recorded = {out.fs_path: out for stage in repo.index.stages for out in stage.outs}  # as dvc.lock has them
        outputs = list(recorded)
        for stage in repo.index.stages:
            name = stage.addressing  # `train@gru`; `seeds/dvc.yaml:seeds` outside dvc.yaml
            if not any(fnmatch.fnmatchcase(name, p) for p in patterns):
                continue
            for out in stage.outs:  # an output new to the lock: hashed from the checkout where git holds it
                if not out.hash_info and is_tracked(out.fs_path):
                    out.save()
            if not all(out.hash_info for out in stage.outs):
                continue
            for dep in stage.deps:  # code (what git tracks) and params anew; data (other stages' outputs) as recorded,
                if isinstance(dep, ParamsDependency) or is_code(dep.fs_path, outputs):  # or from git where new
                    dep.save()
                elif (made := recorded.get(dep.fs_path)) is not None and made.hash_info:  # data: as its maker records
                    dep.hash_info, dep.meta, dep.hash_name = made.hash_info, made.meta, made.hash_name
                elif not dep.hash_info:
                    if not is_tracked(dep.fs_path):
                        raise SystemExit(f"{name}: {dep} is data that dvc.lock records no hash of")
                    dep.save()
            stage.dvcfile.dump(stage, update_pipeline=False)
            done.append(name)
    return done


if __name__ == "__main__":
    names = relock(sys.argv[1:])
    print("relocked:", ", ".join(names) or "nothing (no stage matched, or none has a lock entry)")
