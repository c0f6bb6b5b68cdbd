"""One definition of a run's code: the import closure of the training entry keys checkpoints and cached rows, and
the train stage's DVC deps hold every file of it."""

from __future__ import annotations

import shutil

import pytest
import yaml

from lmpipe import codebase
from lmpipe.checkpoints import code_version
from tests.helpers import ROOT


def copy_of_the_packages(tmp_path):
    for package in codebase.PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def test_an_edit_to_any_file_of_the_training_code_changes_the_key_and_others_do_not(tmp_path):
    root = copy_of_the_packages(tmp_path)
    files = codebase.code_files(root=root)
    assert {"lmpipe/muon.py", "lmpipe/evaluate.py", "lmpipe/perplexity.py", "lmpipe/splits.py", "lmpipe/config.py",
            "lmpipe/train/job.py", "lmpipe/train/trainer.py", "lmpipe/models/rnn.py"} <= set(files)
    base = codebase.code_hash(root=root)
    assert base == code_version()  # the copy is byte for byte the project
    for name in files:
        path = root / name
        before = path.read_bytes()
        path.write_bytes(before + b"\nEDITED = 1\n")
        assert codebase.code_hash(root=root) != base, f"an edit to {name} left the code key unchanged"
        path.write_bytes(before)
    # the n-gram and the loading of any trained model: training scores its own stream, so their edits keep its key
    outside = ["lmpipe/serving.py", "lmpipe/report.py", "lmpipe/tracking/runs.py", "flows/train.py",
               "lmpipe/ngram/model.py", "lmpipe/ngram/counts.py", "lmpipe/trained.py"]
    assert not set(outside) & set(files)
    for name in outside:
        (root / name).write_text((root / name).read_text() + "\nEDITED = 1\n")
    assert codebase.code_hash(root=root) == base


def test_prose_in_the_training_code_leaves_the_key_alone_and_code_does_not(tmp_path):
    """A reworded docstring, a new comment or blank lines keep the key (the seeds' rows and the grid's cached runs
    stay the study's); a string that runs, an operator or a number changes it, even inside a line with a comment."""
    root = copy_of_the_packages(tmp_path)
    base = codebase.code_hash(root=root)
    trainer = root / "lmpipe/train/trainer.py"
    source = trainer.read_text()
    prose = (source.replace('"""Process-wide setup', '"""Reworded: process-wide setup', 1)
             .replace("\ndef ", "\n# a new comment\n\n\ndef ", 1) + "\n\n# the end  \n")
    assert prose != source
    trainer.write_text(prose)
    assert codebase.code_hash(root=root) == base
    for edit in ('\nLABEL = "# not a comment"\n', "\nSCALE = 2  # a comment\n"):
        trainer.write_text(source + edit)
        changed = codebase.code_hash(root=root)
        assert changed != base, edit
        trainer.write_text(source + edit.replace("2", "3").replace("not a", "not the"))
        assert codebase.code_hash(root=root) not in (base, changed), edit


def test_a_new_module_the_training_code_imports_joins_the_key(tmp_path):
    """No list to forget: a module added and imported by the trainer is hashed from then on."""
    root = copy_of_the_packages(tmp_path)
    base = codebase.code_hash(root=root)
    (root / "lmpipe/newpart.py").write_text("SCALE = 1.0\n")
    assert codebase.code_hash(root=root) == base  # not imported yet
    trainer = root / "lmpipe/train/trainer.py"
    trainer.write_text("from lmpipe.newpart import SCALE\n" + trainer.read_text())
    changed = codebase.code_hash(root=root)
    assert "lmpipe/newpart.py" in codebase.code_files(root=root)
    (root / "lmpipe/newpart.py").write_text("SCALE = 2.0\n")
    assert codebase.code_hash(root=root) not in (base, changed)


def test_a_module_imported_relatively_joins_the_key_too(tmp_path):
    root = copy_of_the_packages(tmp_path)
    (root / "lmpipe/train/newpart.py").write_text("SCALE = 1.0\n")
    trainer = root / "lmpipe/train/trainer.py"
    trainer.write_text("from .newpart import SCALE\nfrom .. import newer\n" + trainer.read_text())
    (root / "lmpipe/newer.py").write_text("")
    assert {"lmpipe/train/newpart.py", "lmpipe/newer.py"} <= set(codebase.code_files(root=root))


def test_the_train_stage_depends_on_every_file_of_the_training_code():
    """DVC re-runs a train stage exactly when its checkpoint key changes: the deps cover the key's files (the typed
    reading of params.yaml, and what only it imports, aside: params.yaml states every setting)."""
    deps = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]["train"]["do"]["deps"]
    entry = codebase.module_file(codebase.TRAINING_ENTRY)
    walked = {p.relative_to(ROOT).as_posix() for p in codebase.closure(entry, stop=codebase.PARAMS_SCHEMA)}
    missing = [f for f in codebase.code_files() if f in walked - codebase.PARAMS_SCHEMA
               and not any(f == d or f.startswith(d.rstrip("/") + "/") for d in deps)]
    assert not missing, f"dvc.yaml train@: {missing} key checkpoints but are not deps"


def import_graph():
    """Every project module's imports (function-level ones too), a package's own setup aside, as a directed graph."""
    import networkx as nx

    from lmpipe.codebase import PACKAGES, ROOT, imports_of

    graph = nx.DiGraph()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for imported in imports_of(path):
                if imported != path and "__init__.py" not in (path.name, imported.name):
                    graph.add_edge(path.relative_to(ROOT).as_posix(), imported.relative_to(ROOT).as_posix())
    return graph


def test_no_two_project_modules_import_each_other_round_a_circle():
    """The house has no import circle: following every import from any module of lmpipe, flows or lmpipe_cli never
    leads back to it."""
    import networkx as nx

    assert list(nx.simple_cycles(import_graph())) == []


def test_the_house_has_three_floors_the_command_line_above_the_flows_above_the_library():
    """lmpipe_cli drives flows and lmpipe; flows drive lmpipe; neither lower floor imports a higher one."""
    edges = list(import_graph().edges)
    assert any(a.startswith("lmpipe_cli/") and b.startswith("flows/") for a, b in edges)  # the walk sees the floors
    upward = [(a, b) for a, b in edges if a.split("/")[0] in ("lmpipe", "flows") and b.startswith("lmpipe_cli/")
              or a.startswith("lmpipe/") and b.startswith("flows/")]
    assert upward == []


@pytest.mark.parametrize("one, other", [
    ('X = """a\n\nb"""\n', 'X = """a\nb"""\n'),  # a blank line inside a string is its value
    ('X = """a   \nb"""\n', 'X = """a\nb"""\n'),  # so are trailing spaces there
    ('def f(): """→→→"""; x = 10\n', 'def f(): """→→→"""; y = 10\n'),  # columns past a multi-byte docstring
    ('x = 1\n\x0c\ndef f():\n    """doc"""\n', 'x = 1\n\x0c\ndef g():\n    """doc"""\n')])  # a form feed is no line break
def test_code_that_differs_keeps_its_difference(one, other):
    assert codebase.code_of(one) != codebase.code_of(other)


def test_the_code_of_a_file_drops_its_prose_only():
    source = '"""Module."""\r\n\r\nimport os  # why\r\n\r\n\r\ndef café(x):\r\n    """Doc,\r\n    two lines."""\r\n' \
             '    # a comment\r\n    return os.sep + "# kept"   \r\n'
    assert codebase.code_of(source) == 'import os\ndef café(x):\n    return os.sep + "# kept"'
