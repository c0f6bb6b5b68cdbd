"""The experiments beside the study, each a frozen DVC stage (the scaling grid, the seeds): its flow, then
`dvc commit` of the stage, so that the lock versions what the flow made and the study's `dvc repro` never re-runs
hours of training. `lmpipe scaling` and `lmpipe seeds` call these."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence

from lmpipe_cli import server
from lmpipe import paths


def run_and_commit(flow: str, stage: str, args: Sequence[str] = (), before: Sequence[list[str]] = (),
                   after: Sequence[list[str]] = ()) -> int:
    """`python -m <flow> <args>` with the `before` commands ahead of it and the `after` ones behind `dvc commit
    <stage>`, each in this interpreter's environment; the first that fails stops the rest (its exit code)."""
    env = server.this_environment()
    steps = [*before, [sys.executable, "-m", flow, *args], ["dvc", "commit", "--force", "--quiet", stage], *after]
    for step in steps:
        if code := subprocess.call(step, env=env):
            return code
    return 0


def scaling(spread: Sequence[str] = ()) -> int:
    """The tokens first (the grid trains on them), the grid (its runs spread as `spread`, flows.runners.flags,
    says), then its fits (dvc repro of the scaling pipeline)."""
    code = run_and_commit("flows.scaling", f"{paths.SCALING_PIPELINE}:grid", spread,
                          before=[["dvc", "repro", "--quiet", "tokenize"]],
                          after=[["dvc", "repro", paths.SCALING_PIPELINE]])
    if code == 0:
        print(f"report: {paths.SCALING_REPORT} (and .html); runs: {paths.RUNS}; fits: {paths.SCALING_METRICS}; "
              "the study's report compares with it: dvc repro (re-runs the report and publish only)")
    return code


def seeds(models: list[str] | None = None, spread: Sequence[str] = ()) -> int:
    """Every model's extra seeds (or `models`' alone: the others keep their rows), spread as `spread` says."""
    code = run_and_commit("flows.seeds", f"{paths.SEEDS_PIPELINE}:seeds",
                          [*(flag for m in models or [] for flag in ("--models", m)), *spread])
    if code == 0:
        print(f"runs: {paths.SEEDS}; the report's seed spread and verdicts: dvc repro (re-runs the report and publish only)")
    return code
