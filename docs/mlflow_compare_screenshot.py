"""Screenshot of the MLflow compare view over the newest study's model runs (docs/mlflow-compare.png).

Starts `lmpipe ui` on 127.0.0.1 over this checkout's store, picks the runs that trained the current
models (ngram and every train@<model>, from models/<name>/mlflow_run.json), and has headless Chromium (Debian's `chromium`)
render the compare view: the check that the runs really line up in the UI, kept as a picture.

    python docs/mlflow_compare_screenshot.py [--out docs/mlflow-compare.png]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def model_runs(root: Path = ROOT) -> tuple[str, list[str]]:
    """(experiment id, run ids) of the runs that trained the current models, found by their outputs' content hash."""
    from lmpipe import tracking
    from lmpipe.config import load_params

    evaluated = json.loads((root / "metrics/eval.json").read_text())["models"]  # the LMs, not word2vec
    experiment = load_params(root / "params.yaml").tracking.experiment
    found = [tracking.run_of_output(experiment, root / f"models/{name}") for name in evaluated]
    if not all(found):
        sys.exit("no MLflow run for some of the models here: run dvc repro first")
    return tracking.experiment_id(experiment), found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "docs/mlflow-compare.png"))
    parser.add_argument("--port", type=int, default=5055)
    args = parser.parse_args()
    browser = shutil.which("chromium") or sys.exit("needs Debian's chromium: apt-get install chromium")
    os.chdir(ROOT)
    experiment_id, runs = model_runs()
    ui = subprocess.Popen(["lmpipe", "ui", "--port", str(args.port)], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, start_new_session=True)
    base = f"http://127.0.0.1:{args.port}"
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(f"{base}/health", timeout=1)
                break
            except OSError:
                time.sleep(1)
        query = urllib.parse.urlencode({"runs": json.dumps(runs), "experiments": json.dumps([experiment_id])})
        subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                        "--disable-background-networking", "--disable-component-update", "--disable-sync",
                        "--no-first-run", "--hide-scrollbars", "--window-size=1600,2600",
                        "--virtual-time-budget=20000", f"--screenshot={args.out}", f"{base}/#/compare-runs?{query}"],
                       check=True, capture_output=True, timeout=180)
    finally:
        os.killpg(ui.pid, signal.SIGTERM)
    print(f"{args.out}: compare view of {len(runs)} model runs")


if __name__ == "__main__":
    main()
