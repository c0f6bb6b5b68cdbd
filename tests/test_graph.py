"""The stage graph is complete by test, not by care: every project file a stage's command imports is in its deps,
every params section it reads is in its params, and params.yaml states every setting the code would default.

Read with `ast` only (no torch, no Prefect): a walk of each stage's `python -m <module>` and the project modules it
imports, function-level imports included."""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest
import yaml
from lmpipe import codebase, stage_deps
from lmpipe.config import Params
from tests.helpers import ROOT

PIPELINES = stage_deps.PIPELINES
# The walk and the plumbing are lmpipe.codebase's, the same that keys checkpoints (code_version); the typed reading
# of params.yaml (codebase.PARAMS_SCHEMA) is plumbing for DVC, and the walk does not go on through it.
# Params sections that say where and how a stage runs, not what it computes.
PLUMBING_PARAMS = {"tracking", "orchestration"}
module_file = codebase.module_file


def closure(start: Path) -> set[Path]:
    return codebase.closure(start, stop=codebase.PARAMS_SCHEMA)


def stages() -> list[tuple[str, str, dict]]:
    """(pipeline, stage name, stage) for every stage; a foreach stage once, with its template."""
    out = []
    for pipeline in PIPELINES:
        for name, stage in yaml.safe_load((ROOT / pipeline).read_text())["stages"].items():
            out.append((pipeline, name, stage.get("do", stage)))
    return out


def command_module(stage: dict) -> Path:
    match = re.search(r"python -m ([\w.]+)", stage["cmd"])
    assert match, f"{stage['cmd']}: not a `python -m` command"
    return module_file(match.group(1))


@pytest.mark.parametrize("pipeline,name,stage", stages(), ids=[f"{p}:{n}" for p, n, _ in stages()])
def test_every_stage_depends_on_exactly_the_project_files_it_imports(pipeline, name, stage):
    """Every file the stage's command imports (plumbing aside) is in its deps, and no code dep is one it no longer
    imports: lmpipe.stage_deps writes them."""
    drift = stage_deps.plan(pipeline, name, stage)
    assert not drift, f"{drift} (python -m lmpipe.stage_deps writes them)"


def params_read(path: Path) -> set[str]:
    """Dotted params a module reads: `params.<section>[.<field>...]` chains and `params.section("<name>")`."""
    fields = set(Params.model_fields) | {"validate"}
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute):
            chain, inner = [], node
            while isinstance(inner, ast.Attribute):
                chain.insert(0, inner.attr)
                inner = inner.value
            if isinstance(inner, ast.Name) and inner.id == "params" and chain[0] in fields:
                found.add(".".join(chain).replace("validate_", "validate"))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "section"
              and isinstance(node.func.value, ast.Name) and node.func.value.id == "params"
              and node.args and isinstance(node.args[0], ast.Constant)):
            found.add(node.args[0].value)
    return {read for read in found if read.split(".")[0] in fields}


@pytest.mark.parametrize("pipeline,name,stage", stages(), ids=[f"{p}:{n}" for p, n, _ in stages()])
def test_every_params_section_read_is_a_params_dependency(pipeline, name, stage):
    declared = [p if isinstance(p, str) else next(iter(p)) for p in stage.get("params", [])]
    if {"params.yaml": None} in stage.get("params", []):  # the whole file
        return
    declared = [re.sub(r"\.\$\{key\}$", "", p) for p in declared]  # a foreach stage reads its own entry
    read = set().union(*(params_read(p) for p in closure(command_module(stage))))
    unread = sorted(r for r in read if r.split(".")[0] not in PLUMBING_PARAMS
                    and not any(r == d or r.startswith(d + ".") or d.startswith(r + ".") for d in declared))
    assert not unread, f"{pipeline}: stage {name} reads params {unread}, not in its params"


def test_the_walk_finds_what_a_stage_imports_and_reads(tmp_path):
    """The checks above can fail: the walk sees function-level and `from package import module` imports."""
    files = {p.relative_to(ROOT).as_posix() for p in closure(ROOT / "flows/word2vec.py")}
    assert "lmpipe/audit.py" in files  # imported inside a task function
    assert not any(stage_deps.covers(d, "lmpipe/audit.py") for d in ["flows/word2vec.py", "data/clean/train.txt"])
    assert {"evaluate", "models"} <= params_read(ROOT / "flows/evaluate.py")


DATA_PATH = re.compile(r"(data|models|metrics|plots|reports|scaling|seeds)/")


def literal_paths(path: Path) -> list[str]:
    """String constants (f-string pieces included) in a module that spell out a data path."""
    return [node.value for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and DATA_PATH.match(node.value)]


def test_no_module_spells_out_a_path_but_lmpipe_paths():
    """Flows and library read and write the study's files by lmpipe/paths.py's names (prose and the package's own
    data aside)."""
    modules = sorted([*(ROOT / "flows").glob("*.py"), *(ROOT / "lmpipe").rglob("*.py")])
    spelled = {p.relative_to(ROOT).as_posix(): [s for s in literal_paths(p) if " " not in s] for p in modules
               if p.relative_to(ROOT).as_posix() != "lmpipe/paths.py"}
    package_data = {"lmpipe/audit.py": ["data/weat_tests.json"]}  # a file inside the package, not the study's
    assert {name: found for name, found in spelled.items() if found} == package_data


def test_every_data_path_in_dvc_yaml_is_one_of_lmpipe_paths():
    """dvc.yaml is the map; lmpipe/paths.py the one place the code names a path: a path renamed in one and not the
    other fails here."""
    import lmpipe.paths as paths

    known = {v for k, v in vars(paths).items() if isinstance(v, str) and not k.startswith("_")}
    known |= {f(name) for f in (paths.model_dir, paths.train_metrics, paths.curve, paths.eval_metrics, paths.logprobs)
              for name in (KEY, "ngram")}
    for pipeline, name, stage in stages():
        base = os.path.normpath(Path(pipeline).parent / stage.get("wdir", "."))
        listed = [item if isinstance(item, str) else next(iter(item))
                  for field in ("deps", "outs", "metrics", "plots") for item in stage.get(field, [])]
        for path in listed:
            path = os.path.normpath(os.path.join(base, path)).replace("${key}", KEY)
            if not path.startswith(("lmpipe/", "flows/")):
                assert path in known, f"{pipeline}: stage {name} names {path}, which lmpipe/paths.py does not"


KEY = "some-model"


def test_every_lock_entry_records_the_code_and_params_its_stage_depends_on_now(monkeypatch):
    """A code or params change without its relock leaves the committed lock stale, and a fresh clone's `dvc repro`
    then re-runs that stage (the scaling fits: ~40 min on 2 cores) although its outputs would not change. Each
    dependency git tracks that is no stage's output must hash as dvc.lock records it (`python .ci/relock.py STAGE`
    after a change shown not to move the outputs; `dvc commit` where they moved)."""
    import importlib.util

    from dvc.dependency import ParamsDependency
    from dvc.repo import Repo

    spec = importlib.util.spec_from_file_location("relock", ROOT / ".ci/relock.py")
    relock = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(relock)  # its is_code: what counts as code is the relocking script's own definition
    monkeypatch.chdir(ROOT)  # is_code asks git of the working directory
    stale = []
    with Repo(str(ROOT)) as repo:
        outputs = [out.fs_path for stage in repo.index.stages for out in stage.outs]
        for stage in repo.index.stages:
            for dep in stage.deps:
                if isinstance(dep, ParamsDependency):
                    changed = bool(dep.status())
                elif relock.is_code(dep.fs_path, outputs):
                    changed = dep.hash_info != dep.get_hash()
                else:
                    continue  # data: its making stage's lock entry speaks for it
                if changed:
                    stale.append(f"{stage.addressing}: {os.path.relpath(dep.fs_path, ROOT)}")
    assert not stale, f"dvc.lock records other code or params than these stages depend on now: {stale}"


def held_by_git(path: str, cached: list[str]) -> bool:
    """Whether git holds `path` whole and as committed: tracked, unmodified (a study re-made on another CPU changes
    outputs and its lock together), nothing in it that git does not track and does not ignore, and no output DVC
    caches at, in or around it (a cached output's folder holds only its .gitignore in git)."""
    import subprocess

    def listed(*flags: str) -> str:
        return subprocess.run(["git", "ls-files", *flags, "--", path], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout

    near = [c for c in cached if c == path or c.startswith(path + os.sep) or path.startswith(c + os.sep)]
    return not near and bool(listed()) and not listed("--others", "--exclude-standard") and not listed("--modified")


def test_every_output_git_holds_hashes_as_dvc_lock_records_it():
    """The outputs committed to git (cache: false: metrics, plots, the report) and every stage's reading of them must
    be what dvc.lock records, or a fresh clone whose models reproduce bit for bit re-runs those stages and leaves
    dvc.lock modified (CI fails it). A re-made report whose lock was relocked, not committed (`dvc commit STAGE`),
    is that. A frozen stage's inputs are its history (`dvc repro` never runs it): only its outputs count."""
    from dvc.repo import Repo

    stale = []
    with Repo(str(ROOT)) as repo:
        cached = [os.path.relpath(o.fs_path, ROOT) for stage in repo.index.stages for o in stage.outs if o.use_cache]
        for stage in repo.index.stages:
            deps = [] if stage.frozen else [d for d in stage.deps if d.def_path != "params.yaml"]
            for entry in (*stage.outs, *deps):
                path = os.path.relpath(entry.fs_path, ROOT)
                if entry.hash_info and held_by_git(path, cached) and entry.hash_info != entry.get_hash():
                    stale.append(f"{stage.addressing}: {path}")
    assert not stale, f"dvc.lock records other hashes than the committed files have: {stale}"


def test_python_bytecode_beside_the_sources_is_no_stage_input():
    """Python writes __pycache__/ into lmpipe/models and lmpipe/ngram on import (unless PYTHONDONTWRITEBYTECODE is
    set, as on some machines): DVC must leave it out of those folders' hashes, or every import would make the train
    and score stages look changed and a study would leave dvc.lock modified."""
    from dvc.repo import Repo

    with Repo(str(ROOT)) as repo:
        for folder in ("lmpipe/models", "lmpipe/ngram"):
            assert repo.dvcignore.is_ignored_dir(str(ROOT / folder / "__pycache__"))
            assert repo.dvcignore.is_ignored_file(str(ROOT / folder / "__pycache__" / "base.cpython-311.pyc"))
        assert not repo.dvcignore.is_ignored_file(str(ROOT / "lmpipe/models/base.py"))
