"""`make test` on pytest-xdist's workers: each end-to-end group on one worker, and the study built once for all."""

from __future__ import annotations

import ast
import os
import re
import shlex
import shutil
import subprocess
import sys

from tests.helpers import ROOT

GROUPS = {"first": ("first_1", "first_2", "first_3", "first_4"), "second": ("second_1", "second_2")}
STUDY = '''
import os, pytest
from tests.helpers import built_once
pytestmark = pytest.mark.e2e
SECOND_STUDY = ("test_second_1", "test_second_2")


@pytest.fixture(scope="session")
def project(tmp_path_factory):
    def build(folder):
        with open(os.environ["BUILDS"], "a") as f:
            f.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")
        return ""
    return built_once(tmp_path_factory, "project", build)


def ran(name):
    with open(os.environ["RAN"], "a") as f:
        f.write(name + " " + os.environ["PYTEST_XDIST_WORKER"] + "\\n")
''' + "".join(f"\n\ndef test_{name}(project):\n    ran('{name}')\n"
              for name in ("first_1", "first_2", "second_1", "first_3", "second_2", "first_4"))
BUILT_ONCE = '''
import os, time, pytest
from tests.helpers import built_once


@pytest.fixture(scope="session")
def study(tmp_path_factory):
    def build(folder):
        time.sleep(3)  # long enough for the other worker to ask meanwhile
        (folder / "model.txt").write_text("trained")
        with open(os.environ["BUILDS"], "a") as f:
            f.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")
        return "built by " + os.environ["PYTEST_XDIST_WORKER"]
    return built_once(tmp_path_factory, "study", build)


def test_it(study):
    folder, said = study
    worker = os.environ["PYTEST_XDIST_WORKER"]
    before = (folder / "model.txt").read_text()
    (folder / "model.txt").write_text("changed-by-" + worker)
    time.sleep(2)  # the other worker's test writes meanwhile: in its own copy, not here
    with open(os.environ["RAN"], "a") as f:
        f.write(f"{worker} {folder} {before} {(folder / 'model.txt').read_text()} {said}\\n")
'''
UNITS = "".join(f"def test_{i}():\n    pass\n\n\n" for i in range(6))


def test_each_end_to_end_group_runs_on_one_worker_and_builds_its_study_once(tmp_path):
    """pytest 9.2 with pytest-xdist 3.8 ignores `xdist_group` (pytest-xdist#1386): a group's tests then go round
    robin. The Makefile's own xdist options on a stand-in suite with the project's conftest: each group's tests on one
    worker, and one build of the study in all (`built_once`)."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests/__init__.py").touch()
    for name in ("conftest.py", "helpers.py"):  # the conftest imports its helpers
        shutil.copy(ROOT / "tests" / name, tmp_path / "tests" / name)
    (tmp_path / "tests/test_study.py").write_text(STUDY)
    for n in range(3):
        (tmp_path / f"tests/test_units_{n}.py").write_text(UNITS)
    (tmp_path / "pyproject.toml").write_text('[tool.pytest.ini_options]\nmarkers = ["e2e: stand-in"]\n')
    xdist = re.search(r"^XDIST := (.+)$", (ROOT / "Makefile").read_text(), re.M).group(1)
    builds, ran = tmp_path / "builds.txt", tmp_path / "ran.txt"
    env = {**os.environ, "BUILDS": str(builds), "RAN": str(ran), "PYTHONPATH": str(ROOT),
           "PYTEST_XDIST_AUTO_NUM_WORKERS": "2"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *shlex.split(xdist)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "24 passed" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
    worker_of = dict(line.split() for line in ran.read_text().splitlines())
    for group, tests in GROUPS.items():
        assert len({worker_of[t] for t in tests}) == 1, f"group {group} ran on several workers: {worker_of}"
    assert len(builds.read_text().split()) == 1, f"studies built on {builds.read_text().split()}: once in all"


def test_the_study_is_built_once_and_each_worker_gets_a_copy_of_its_own(tmp_path):
    """Two modules on two workers ask for one session study at once: one worker builds it, the other waits and
    copies it, and a change a test makes in its copy reaches no other copy."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests/__init__.py").touch()
    shutil.copy(ROOT / "tests/helpers.py", tmp_path / "tests/helpers.py")
    for name in ("a", "b"):
        (tmp_path / f"tests/test_{name}.py").write_text(BUILT_ONCE)
    builds, ran = tmp_path / "builds.txt", tmp_path / "ran.txt"
    env = {**os.environ, "BUILDS": str(builds), "RAN": str(ran), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-n", "2",
                           "--dist", "loadfile", "--basetemp", str(tmp_path / "tmp")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "2 passed" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
    builder = builds.read_text().split()
    assert len(builder) == 1, f"built {len(builder)} times"
    rows = [line.split() for line in ran.read_text().splitlines()]
    assert sorted(row[0] for row in rows) == ["gw0", "gw1"] and len({row[1] for row in rows}) == 2
    assert all(row[2:] == ["trained", f"changed-by-{row[0]}", "built", "by", builder[0]] for row in rows), rows


def test_every_second_study_name_is_a_test_of_its_module():
    """A module's SECOND_STUDY names its tests that go to the second copy; a name that is not one of them (a renamed
    test, or a lone string, which `in` searches as text) silently puts the test back on the first worker."""
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        tree = ast.parse(path.read_text())
        tests = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "SECOND_STUDY" for t in node.targets):
                names = ast.literal_eval(node.value)
                assert isinstance(names, tuple) and names, f"{path.name}: SECOND_STUDY must be a tuple of test names"
                assert set(names) <= tests, f"{path.name}: SECOND_STUDY names no test {sorted(set(names) - tests)}"
