"""Independent runs on the Prefect task runner (flows.runners.run_apart): results in the order given, at most so many
of a family at once, every other result when one fails; the scaling grid on two Dask workers: the sequential grid's
rows, a failed run that costs no other its row, and a rerun that trains nothing."""

from __future__ import annotations

import re
import shutil
import threading
import time
from collections import Counter

import pytest
import yaml
from prefect import task

from tests.helpers import ROOT, entry, project_params, synthetic_data, write_tokens

STEPS, LOCK = [], threading.Lock()


@task
def step(n: int, group: str, cwd: str | None = None) -> int:
    """A run of `group` that takes a moment, noting when it starts and ends; run 2 fails."""
    with LOCK:
        STEPS.append((group, +1, n))
    time.sleep(0.3)
    with LOCK:
        STEPS.append((group, -1, n))
    if n == 2:
        raise ValueError("run 2 failed")
    return 10 * n


def test_runs_side_by_side_keep_their_order_a_groups_limit_and_every_other_result_when_one_fails(prefect_api):
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from prefect.task_runners import ThreadPoolTaskRunner

    from flows.runners import in_parallel

    calls = [{"n": n, "group": g} for n, g in enumerate("aaabb")]
    with temporary_settings({PREFECT_API_URL: prefect_api}):
        outcomes = in_parallel(step, calls, [c["group"] for c in calls], ThreadPoolTaskRunner(max_workers=4),
                               per_group=2, name="test-runs")
    assert outcomes[:2] == [0, 10] and isinstance(outcomes[2], ValueError) and outcomes[3:] == [30, 40]
    running, most = Counter(), Counter()
    for group, change, _ in STEPS:
        running[group] += change
        most[group] = max(most[group], running[group])
    assert most == {"a": 2, "b": 2}  # the two b runs beside two a runs
    third, first_end = STEPS.index(("a", +1, 2)), min(STEPS.index(("a", -1, n)) for n in (0, 1))
    assert third > first_end  # a group's third run waits for one of its first two

SIZES = [{"emb": 8, "hidden": 8}, {"emb": 16, "hidden": 16}]
MODELS = {"gru": entry("rnn", {"cell": "gru", "emb": 16, "hidden": 16}, epochs=1),
          "lstm": entry("rnn", {"cell": "lstm", "emb": 16, "hidden": 16}, epochs=1)}


def tiny_grid(root, runner: str):
    """A project at `root`: a synthetic corpus, and a grid of 2 families x 2 sizes at one tiny budget (a fraction of
    an epoch each) trained on `runner` (two workers)."""
    write_tokens(root, synthetic_data())
    (root / "scaling").mkdir()
    shutil.copy(ROOT / "scaling/dvc.yaml", root / "scaling/dvc.yaml")  # the families the grid stage declares
    (root / "params.yaml").write_text(yaml.safe_dump(project_params(
        models=MODELS, orchestration={"task_runner": runner, "address": None, "workers": 2},
        scaling={"models": {m: SIZES for m in MODELS}, "budgets": [2e7],
                 "overrides": {"batch_size": 4, "seq_len": 16}})))
    return root


def run_grid(root, monkeypatch, prefect_api):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.scaling import grid

    monkeypatch.chdir(root)
    with temporary_settings({PREFECT_API_URL: prefect_api}):
        grid()
    return (root / "scaling/runs.csv").read_text()


def cached_rows(root) -> dict:
    """Each cached row file of the grid and when it was written."""
    return {p.name: p.stat().st_mtime_ns for p in (root / ".cache/lmpipe/scaling/runs").glob("*.json")}


def test_workers_or_an_address_spread_one_call_as_params_yaml_would():
    from flows.runners import flags, orchestration_with
    from lmpipe.config import OrchestrationParams
    from lmpipe.errors import ConfigError
    from tests.helpers import section

    settings = OrchestrationParams(**section("orchestration"))
    assert orchestration_with(settings) == settings
    local = orchestration_with(settings, workers=4)
    assert (local.task_runner, local.workers, local.address) == ("dask", 4, None)
    assert orchestration_with(settings, address="tcp://head:8786").task_runner == "dask"
    assert orchestration_with(settings, address="ray://head:10001").task_runner == "ray"
    assert flags(4, None) == ["--workers", "4"] and flags(None, "tcp://head:8786") == ["--address", "tcp://head:8786"]
    with pytest.raises(ConfigError, match="--workers 0: at least 1"):
        orchestration_with(settings, workers=0)


@pytest.mark.slow
def test_two_dask_workers_give_the_sequential_rows_a_failed_run_costs_no_other_its_row_and_a_rerun_trains_nothing(
        tmp_path, monkeypatch, mlflow_store, prefect_api):
    """~4 min on 2 busy cores, nearly all of it the Dask workers' start (importing torch, Prefect and MLflow)."""
    pytest.importorskip("prefect_dask")
    from flows.scaling import plan
    from lmpipe.config import load_params
    from lmpipe.errors import LmpipeError
    from lmpipe.splits import load_tokens

    sequential = run_grid(tiny_grid(tmp_path / "sequential", "sequential"), monkeypatch, prefect_api)
    assert len(sequential.splitlines()) == 1 + 4  # the header, then the grid's points in its own order
    root = tiny_grid(tmp_path / "dask", "dask")
    monkeypatch.chdir(root)
    points, jobs = plan(load_params("params.yaml"), load_tokens())
    blocked = jobs[1].ckpt_dir  # a file where its checkpoint folder goes: the run fails at its first save
    blocked.parent.mkdir(parents=True)
    blocked.write_text("not a folder")
    with pytest.raises(LmpipeError, match=re.escape(f"1 of 4 grid runs failed, the first {points[1].name}: ")):
        run_grid(root, monkeypatch, prefect_api)
    assert not (root / "scaling/runs.csv").exists()
    written = cached_rows(root)  # the three others finished, each its row cached
    assert sorted(name.rsplit("-", 1)[0] for name in written) == sorted(p.name for i, p in enumerate(points) if i != 1)
    blocked.unlink()
    assert run_grid(root, monkeypatch, prefect_api) == sequential  # the same rows, in the grid's order
    assert {k: v for k, v in cached_rows(root).items() if k in written} == written  # the failed run alone trained
    written = cached_rows(root)
    assert len(written) == 4
    assert run_grid(root, monkeypatch, prefect_api) == sequential
    assert cached_rows(root) == written  # every row read back, none trained again
