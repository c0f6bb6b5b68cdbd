"""Shared fixtures: a small real corpus, a local HTTP server, and one Prefect server for the session."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))  # `make test` runs on pytest-xdist's workers
# Each worker, and every stage it starts, takes its share of the cores, set before numpy and torch start their thread
# pools: two workers of two threads each on two cores wait on each other's threads.
if WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // WORKERS)))

import numpy as np
import pytest

from flows.server import use_project_home
from lmpipe.telemetry import switch_off

ROOT = Path(__file__).resolve().parents[1]
switch_off()  # telemetry off for everything the tests import and start
use_project_home(root=ROOT)  # and Prefect's home this checkout's, as for the stages and `lmpipe`
SHARED = ROOT.parent / "shared"


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook, which reads the groups
def pytest_collection_modifyitems(items):
    """`make test` spreads the tests over pytest-xdist's workers by group (`--dist loadgroup`, in collection order):
    a module's tests go to one worker, as with `--dist loadfile`, so its module fixtures are built once, except the
    end-to-end tests a module names in SECOND_STUDY, a group of their own. The end-to-end groups come first, so the
    two long ones start at once, on two workers, and the short modules fill in beside them. (pytest 9.2 breaks the
    groups, pytest-xdist#1386: tests/test_conftest.py checks them.)"""
    second_study = set()
    for item in items:
        module = getattr(item, "module", None)
        if module is None or item.get_closest_marker("xdist_group"):
            continue
        if getattr(item, "originalname", item.name) in getattr(module, "SECOND_STUDY", ()):
            second_study.add(item.nodeid)
        item.add_marker(pytest.mark.xdist_group(module.__name__ + (".second-study" if item.nodeid in second_study
                                                                   else "")))
    items.sort(key=lambda item: (item.get_closest_marker("e2e") is None, item.nodeid not in second_study))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    from flows import server

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

    root, params = tmp_path_factory.mktemp("default"), load_params(ROOT / "params.yaml")  # the study's corpus
    fetch_corpus(params.corpus, root / "raw", root / "cache")
    prepare_corpus(root / "raw", root / "clean", params.corpus, params.split)
    metrics = tokenize_corpus(root / "clean", root / "tokens", params.tokenizer)
    return {s: np.load(root / "tokens" / f"{s}.npy") for s in ("train", "valid")}, metrics
