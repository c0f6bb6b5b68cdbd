"""docs/architecture.md's "One model's way": the walk a newcomer takes from dvc.yaml to the registry is the code's.

Checked on the code with `ast`: the walk names at most six files; dvc.yaml's train and score stages start where it
says; a file of the walk imports project code only from files later in the walk or from modules off it (the
blocks that return), so a reader never goes back to a file already left; and the Trainer's methods the walk names
come in the file in the order it names them, the order a run meets them."""

from __future__ import annotations

import ast
import re

import yaml

from lmpipe import codebase
from tests.helpers import ROOT

SECTION = "## One model's way, from dvc.yaml to the registry"


def walk() -> list[tuple[str, str]]:
    """(file, its item's text) for each numbered item of the section, in order."""
    text = (ROOT / "docs/architecture.md").read_text().split(SECTION, 1)[1].split("\n## ", 1)[0]
    items = re.split(r"\n(?=\d+\. \*\*)", text)[1:]
    return [(re.match(r"\d+\. \*\*([^*]+)\*\*", item).group(1), item) for item in items]


def reached(path: str) -> set[str]:
    """The project files a file imports (lmpipe.codebase.imports_of: function-level and relative imports too), and
    through a package's __init__.py the files it re-exports from (`from lmpipe.train import Trainer`)."""
    files = codebase.imports_of(ROOT / path)
    files |= set().union(*(codebase.imports_of(f) for f in files if f.name == "__init__.py"))
    return {f.relative_to(ROOT).as_posix() for f in files}


def test_the_walk_opens_at_most_six_files_starting_where_dvc_yaml_does():
    files = [f for f, _ in walk()]
    assert files[0] == "dvc.yaml" and len(files) <= 6, files
    assert all((ROOT / f).exists() for f in files), files
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    for stage in ("train", "score"):
        command = stages[stage]["do"]["cmd"]
        assert f"python -m flows.{stage} " in command and f"flows/{stage}.py" in files, (stage, command)


def test_no_file_of_the_walk_goes_back_to_one_already_left():
    files = [f for f, _ in walk() if f.endswith(".py")]
    for i, path in enumerate(files):
        assert not reached(path) & set(files[:i]), f"{path} imports {reached(path) & set(files[:i])}"


def test_the_trainers_methods_come_in_the_order_the_walk_names_them():
    text = dict(walk())["lmpipe/train/trainer.py"]
    tree = ast.parse((ROOT / "lmpipe/train/trainer.py").read_text())
    trainer = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Trainer")
    lines = {f.name: f.lineno for f in trainer.body if isinstance(f, ast.FunctionDef)}
    named = [name for name in re.findall(r"`(?:Trainer\.)?(\w+)`", text) if name in lines]
    assert len(named) >= 5, named
    assert [lines[n] for n in named] == sorted(lines[n] for n in named), named
