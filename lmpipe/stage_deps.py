"""Each stage's code deps in the pipeline files, written from lmpipe.codebase's import walk, never kept by hand.

    python -m lmpipe.stage_deps            rewrite the code deps of every stage that drifts
    python -m lmpipe.stage_deps --check    one line per drifting stage (what is missing, what is extra); exit 1

A stage's code deps are the project files its `python -m` module imports, directly or through other project files,
less the plumbing codebase declares (PLUMBING; the typed params reading, PARAMS_SCHEMA, is neither listed nor walked
through: DVC tracks params.yaml itself). Everything else in `deps` (data, models, metrics, package data such as
lmpipe/data/) is left where it stands. A package listed as a folder (lmpipe/models) covers its files and stays while
the stage imports one of them; a newly imported file is added by its own name after the stage's last code dep. The
file is edited line by line where ruamel.yaml places each entry, so its layout and comments stay as they are (a YAML
dump, DVC's `modify_yaml` included, would re-indent every list of the file). Plumbing itself: no stage imports it.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from lmpipe import codebase, paths
from lmpipe.dvc_files import pipeline_stages

PIPELINES = ("dvc.yaml", paths.SEEDS_PIPELINE, paths.SCALING_PIPELINE)
NOT_DEPS = codebase.PLUMBING | codebase.PARAMS_SCHEMA


@dataclass(frozen=True)
class Drift:
    """A stage's code deps against its imports: files it imports that no dep covers, deps it no longer imports."""

    pipeline: str
    stage: str
    missing: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.missing or self.extra)

    def __str__(self) -> str:
        said = [f"{what} {', '.join(files)}" for what, files in (("missing", self.missing), ("extra", self.extra))
                if files]
        return f"{self.pipeline}:{self.stage}: {'; '.join(said)}"


def command_module(cmd: str) -> str:
    """The module a stage runs: `python -m flows.train --model ${key}` -> flows.train."""
    match = re.search(r"python -m ([\w.]+)", cmd)
    if not match:
        raise ValueError(f"{cmd}: not a `python -m` command, so its imports cannot be walked")
    return match.group(1)


def imported(module: str, root: Path = codebase.ROOT) -> set[str]:
    """The files (relative to root) whose code decides what `module` computes: its closure less the plumbing."""
    start = codebase.module_file(module, root)
    if start is None:
        raise ValueError(f"{module}: no such project module")
    walked = codebase.closure(start, root, stop=codebase.PARAMS_SCHEMA)
    return {p.relative_to(root).as_posix() for p in walked} - NOT_DEPS


def is_code(path: str, root: Path = codebase.ROOT) -> bool:
    """Whether a dep (relative to root) is project code: a module of lmpipe or flows, or a package's folder."""
    if path.split("/")[0] not in codebase.PACKAGES:
        return False
    return path.endswith(".py") or (root / path / "__init__.py").is_file()


def covers(dep: str, file: str) -> bool:
    return file == dep or file.startswith(dep.rstrip("/") + "/")


def _entry(stage: dict) -> dict:
    return stage.get("do", stage)  # a foreach stage: its template


def _base(pipeline: str, entry: dict) -> str:
    """The folder a stage's deps are relative to (its wdir), relative to root."""
    return os.path.normpath(os.path.join(os.path.dirname(pipeline), entry.get("wdir", ".")))


def _dep_path(dep) -> str:
    return dep if isinstance(dep, str) else next(iter(dep))


def plan(pipeline: str, name: str, stage: dict, root: Path = codebase.ROOT) -> Drift:
    """What `stage` (as pipeline_stages reads it) lacks and has too many of among its code deps."""
    entry = _entry(stage)
    base = _base(pipeline, entry)
    deps = [os.path.normpath(os.path.join(base, _dep_path(d))) for d in entry.get("deps", [])]
    code = [d for d in deps if is_code(d, root)]
    files = imported(command_module(entry["cmd"]), root)
    missing = sorted(f for f in files if not any(covers(d, f) for d in code))
    extra = [d for d in code if not any(covers(d, f) for f in files)]
    return Drift(pipeline, name, missing, extra)


def drifts(root: Path = codebase.ROOT) -> list[Drift]:
    """Every stage of the pipeline files whose code deps differ from what its command imports."""
    found = []
    for pipeline in PIPELINES:
        for name, stage in pipeline_stages(root / pipeline).items():
            if drift := plan(pipeline, name, stage, root):
                found.append(drift)
    return found


def rewrite(text: str, pipeline: str, fixes: list[Drift], root: Path = codebase.ROOT) -> str:
    """`text` (a pipeline file) with each drifting stage's extra code deps' lines dropped and its missing files added
    after its last code dep that stays, in the same indentation; every other line as it was."""
    from ruamel.yaml import YAML

    document = YAML().load(text)
    lines = text.splitlines(keepends=True)
    drop: set[int] = set()
    add: dict[int, list[str]] = {}
    for fix in fixes:
        entry = _entry(document["stages"][fix.stage])
        deps = entry.get("deps")
        if deps is None:
            raise ValueError(f"{pipeline}:{fix.stage}: no deps list to write into; add one by hand")
        base = _base(pipeline, entry)
        rows = [(deps.lc.item(i), os.path.normpath(os.path.join(base, _dep_path(d)))) for i, d in enumerate(deps)]
        drop |= {line for (line, _), path in rows if path in fix.extra}
        code = [(line, col) for (line, col), path in rows if line not in drop and is_code(path, root)]
        line, col = code[-1] if code else max((pos for pos, _ in rows), default=(None, None))
        if fix.missing and line is None:
            raise ValueError(f"{pipeline}:{fix.stage}: an empty deps list; add one entry by hand")
        if fix.missing:
            prefix = lines[line][:col]
            add[line] = [f"{prefix}{os.path.relpath(f, base)}\n" for f in fix.missing]
    out = []
    for i, row in enumerate(lines):
        if i not in drop:
            out.append(row)
        out.extend(add.get(i, []))
    return "".join(out)


def write(root: Path = codebase.ROOT) -> list[Drift]:
    """Rewrite the code deps of every drifting stage; the drifts written."""
    found = drifts(root)
    for pipeline in PIPELINES:
        fixes = [d for d in found if d.pipeline == pipeline]
        if fixes:
            path = root / pipeline
            path.write_text(rewrite(path.read_text(encoding="utf-8"), pipeline, fixes, root), encoding="utf-8")
    left = drifts(root)
    if left:
        raise RuntimeError("the rewrite left drift: " + "; ".join(map(str, left)))
    return found


def relock_name(drift: Drift, root: Path = codebase.ROOT) -> str:
    """The stage as .ci/relock.py takes it (a foreach stage: all of its runs)."""
    stage = pipeline_stages(root / drift.pipeline)[drift.stage]
    name = f"{drift.stage}@*" if "foreach" in stage else drift.stage
    return name if drift.pipeline == "dvc.yaml" else f"{drift.pipeline}:{name}"


def main(argv: list[str] | None = None, root: Path = codebase.ROOT) -> int:
    parser = argparse.ArgumentParser(prog="python -m lmpipe.stage_deps", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="only say which stages drift; exit 1 if any")
    args = parser.parse_args(argv)
    found = drifts(root) if args.check else write(root)
    for drift in found:
        print(drift)
    if found and not args.check:
        print("then: python .ci/relock.py " + " ".join(f"'{relock_name(d, root)}'" for d in found))
    return 1 if args.check and found else 0


if __name__ == "__main__":
    sys.exit(main())
