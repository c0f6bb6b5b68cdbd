"""Shared fixtures: a small real corpus, a test's own MLflow store, one Prefect server for the session, the committed
params in a test's folder, and the end-to-end tests' tiny study with its copies. Plain helpers: tests/helpers.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))  # `make test` runs on pytest-xdist's workers
# Each worker, and every stage it starts, takes its share of the cores, set before numpy and torch start their thread
# pools: two workers of two threads each on two cores wait on each other's threads.
if WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // WORKERS)))

import numpy as np
import pytest

from flows._prefect import use_project_home
from lmpipe.telemetry import switch_off
from tests.helpers import PARAMS, ROOT, TINY, built_once, free_port, override, run

switch_off()  # telemetry off for everything the tests import and start
use_project_home(root=ROOT)  # and Prefect's home this checkout's, as for the stages and `lmpipe`


SECOND_STUDY_AFTER = 60  # unit tests, some 6-8 min of them, the second worker runs while the first builds the study


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook, which reads the groups
def pytest_collection_modifyitems(items):
    """`make test` spreads the tests over pytest-xdist's workers by group (`--dist loadgroup`, in collection order):
    a module's tests go to one worker, as with `--dist loadfile`, so its module fixtures are built once; the
    end-to-end tests of the study (e2e, on `project`, in whichever module) go to one worker, except those their module
    names in SECOND_STUDY, a group of their own on a second worker. The end-to-end groups come first, so the long one
    starts at once and builds the study; the second study's group comes after SECOND_STUDY_AFTER unit tests, which the
    second worker runs meanwhile, and then takes its copy of the study (`project`); the short modules fill in beside.
    (pytest 9.2 breaks the groups, pytest-xdist#1386: tests/test_conftest.py checks them.)"""
    second_study = set()
    for item in items:
        module = getattr(item, "module", None)
        if module is None or item.get_closest_marker("xdist_group"):
            continue
        study = item.get_closest_marker("e2e") and "project" in getattr(item, "fixturenames", ())
        group = "study" if study else module.__name__
        if getattr(item, "originalname", item.name) in getattr(module, "SECOND_STUDY", ()):
            second_study.add(item.nodeid)
            group += ".second-study"
        item.add_marker(pytest.mark.xdist_group(group))
    second = [item for item in items if item.nodeid in second_study]
    first = [item for item in items if item.get_closest_marker("e2e") and item.nodeid not in second_study]
    units = [item for item in items if not item.get_closest_marker("e2e") and item.nodeid not in second_study]
    items[:] = first + units[:SECOND_STUDY_AFTER] + second + units[SECOND_STUDY_AFTER:]


@pytest.fixture()
def mlflow_store(tmp_path, monkeypatch) -> str:
    """A new MLflow store of the test's own (sqlite in tmp_path) as the tracking URI, and no study run inherited
    from the shell: what every test that records runs starts from."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("LMPIPE_PARENT_RUN_ID", raising=False)
    return uri


@pytest.fixture(scope="session")
def prefect_api(tmp_path_factory):
    """One `prefect server` for the whole suite (an ephemeral server per stage process costs ~12 s)."""
    from lmpipe_cli import server

    home = tmp_path_factory.mktemp("prefect-home")
    saved = dict(os.environ)
    os.environ.update(PREFECT_HOME=str(home), PREFECT_UI_ENABLED="false")  # for the server alone: the project's settings
    try:
        url, process = server.start(free_port(), log_dir=home, timeout=180)
    except Exception as exc:
        pytest.fail(f"prefect server did not start: {exc}")
    finally:
        os.environ.clear()
        os.environ.update(saved)
    yield url
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()


@pytest.fixture(scope="session")
def sample_articles():
    """The first 12 articles of the real enwiki sample gensim ships (offline)."""
    from lmpipe.corpus.sources import ENWIKI_SAMPLE
    from lmpipe.corpus.wiki import iter_wiki_articles

    return list(iter_wiki_articles(ENWIKI_SAMPLE, max_articles=12))


@pytest.fixture(scope="session")
def default_tokens(tmp_path_factory):
    """The default study's corpus and tokenizer (all 106 articles), built with the default params."""
    from lmpipe.config import load_params
    from lmpipe.corpus.prepare import prepare_corpus
    from lmpipe.corpus.sources import fetch_corpus
    from lmpipe.tokenize import tokenize_corpus

    root, params = tmp_path_factory.mktemp("default"), load_params(PARAMS)  # the study's corpus
    fetch_corpus(params.corpus, root / "raw", root / "cache")
    prepare_corpus(root / "raw", root / "clean", params.corpus, params.split)
    metrics = tokenize_corpus(root / "clean", root / "tokens", params.tokenizer)
    return {s: np.load(root / "tokens" / f"{s}.npy") for s in ("train", "valid")}, metrics


@pytest.fixture()
def params_file(tmp_path) -> Path:
    """The committed params.yaml, copied into tmp_path: the test's own, to run from or to edit."""
    shutil.copy(PARAMS, tmp_path / "params.yaml")
    return tmp_path / "params.yaml"


# ---------------- the end-to-end tests' study (tests/test_e2e_*.py) and its copies ----------------

@pytest.fixture(scope="session")
def project(tmp_path_factory, prefect_api):
    """A git copy of the tracked project with tiny params, after one `dvc repro`: built once for the whole run
    (`built_once`: each xdist worker takes a copy) and shared by every end-to-end module, as ~5-10 min of stages is
    too dear to repeat."""
    env = {**os.environ, "PREFECT_API_URL": prefect_api, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL": "0.2"}  # a tiny training can end within 1 s, and MLflow logs
    # no sample for a run that ends before its first interval (on a Zen 5, CI: no system/* metric at 1 s)
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("LMPIPE_PARENT_RUN_ID", None)

    def build(copy: Path) -> str:
        tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True)
        for name in filter(None, tracked.stdout.split("\0")):
            if (ROOT / name).is_file():
                (copy / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / name, copy / name)
        for name in ("dvc.lock", "scaling/dvc.lock"):  # a fresh study: nothing recorded yet
            (copy / name).unlink(missing_ok=True)
        override(copy / "params.yaml", TINY)
        git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
        run(["git", "init", "-q"], copy, env)
        run(git + ["add", "-A"], copy, env)
        run(git + ["commit", "-qm", "copy"], copy, env)
        return run(["dvc", "repro"], copy, env, timeout=1800).stdout  # every stage: ~5-10 min on a 2-core CPU

    copy, said = built_once(tmp_path_factory, "project", build)
    return copy, env, subprocess.CompletedProcess(["dvc", "repro"], 0, stdout=said, stderr="")


@pytest.fixture
def scratch(project, tmp_path):
    """A copy of the studied project (git, DVC cache, MLflow store and all) that a test may change freely: no test
    depends on another's edits."""
    copy, env, _ = project
    target = tmp_path / "project"
    shutil.copytree(copy, target, symlinks=True, ignore=shutil.ignore_patterns("mlartifacts", "mlflow.db*"))  # its own store
    return target, env


@pytest.fixture
def committed(project, tmp_path):
    """A copy of the studied project with its MLflow store (so its champions), everything committed: a retrain
    commits on top of HEAD, and the test can tell what changed."""
    copy, env, _ = project
    target = tmp_path / "project"
    shutil.copytree(copy, target, symlinks=True)
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    run(git + ["add", "-A"], target, env)
    run(git + ["commit", "-qm", "studied"], target, env)
    return target, env
