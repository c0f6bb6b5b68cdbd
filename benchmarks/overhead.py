"""Orchestration overhead of `dvc repro`: wall time split into compute versus Prefect + MLflow + DVC.

Runs `dvc repro --force` in a temporary git copy of the project (default params unless overridden
with --set section.key=value), or with --in-place in this checkout (which then holds the fresh study),
against a running Prefect server (`lmpipe server`, or PREFECT_API_URL).
Compute is the time Prefect measured inside the stages' tasks (the lmpipe calls); everything else
(interpreter start, imports of prefect/mlflow, flow and run bookkeeping, DVC hashing) is overhead.
Prints, as its last line: `orchestration overhead: X% of N s`. --dry-run makes the copy and lists the stages the
forced repro would run (`dvc repro --force --dry`), running none and needing no server.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flows._prefect import running_server  # noqa: E402
from lmpipe.overrides import apply_overrides  # noqa: E402


def copy_project(dest: Path, overrides: list[str]) -> None:
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for name in filter(None, files.split("\0")):
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    params = apply_overrides(yaml.safe_load((dest / "params.yaml").read_text()), overrides)
    (dest / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    git = ["git", "-c", "user.email=b@b", "-c", "user.name=b"]
    for args in (["git", "init", "-q"], git + ["add", "-A"], git + ["commit", "-qm", "bench"]):
        subprocess.run(args, cwd=dest, check=True)


def task_seconds(api: str, since: str) -> float:
    """Total run time of all task runs that started after `since` (ISO time), from the Prefect API."""
    body = {"task_runs": {"start_time": {"after_": since}}, "limit": 200}
    runs = requests.post(f"{api}/task_runs/filter", json=body, timeout=30).json()
    return sum(r["total_run_time"] for r in runs)


def dry_run(overrides: list[str], in_place: bool) -> None:
    """The stages `dvc repro --force` would run in the copy (or this checkout), in order, without running them."""
    with tempfile.TemporaryDirectory() as tmp:
        project = ROOT if in_place else Path(tmp)
        if not in_place:
            copy_project(project, overrides)
        done = subprocess.run(["dvc", "repro", "--force", "--dry"], cwd=project, check=True, capture_output=True,
                              text=True)
    stages = re.findall(r"^Running stage '([^']+)'", done.stdout, re.MULTILINE)
    print(f"dvc repro --force would run {len(stages)} stages: {', '.join(stages)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", action="append", default=[], help="params override, e.g. corpus.max_articles=20")
    parser.add_argument("--in-place", action="store_true", help="run in this checkout instead of a temporary copy")
    parser.add_argument("--dry-run", action="store_true", help="list the stages the forced repro would run; run none")
    args = parser.parse_args()
    if args.in_place and args.set:
        sys.exit("--in-place runs this checkout's params.yaml as it is; edit it instead of passing --set")
    if args.dry_run:
        return dry_run(args.set, args.in_place)
    api = running_server()
    if not api:
        sys.exit("start a Prefect server first (lmpipe server) or set PREFECT_API_URL")
    with tempfile.TemporaryDirectory() as tmp:
        project = ROOT if args.in_place else Path(tmp)
        if not args.in_place:
            copy_project(project, args.set)
        env = {**os.environ, "PREFECT_API_URL": api}
        env.pop("MLFLOW_TRACKING_URI", None)
        since = requests.get(f"{api}/admin/version", timeout=10) and time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        started = time.perf_counter()
        subprocess.run(["dvc", "repro", "--force"], cwd=project, env=env, check=True, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - started
        compute = task_seconds(api, since)
        started = time.perf_counter()
        noop = subprocess.run(["dvc", "repro"], cwd=project, env=env, check=True, capture_output=True, text=True)
        noop_wall = time.perf_counter() - started
    assert "Running stage" not in noop.stdout
    print(f"dvc repro --force: {wall:.1f} s wall, {compute:.1f} s compute inside tasks")
    print(f"no-op dvc repro: {noop_wall:.1f} s")
    print(f"orchestration overhead: {100 * (wall - compute) / wall:.0f}% of {wall:.0f} s")


if __name__ == "__main__":
    main()
