"""Screenshots of what a user looks at, taken by headless Chromium (Debian's `chromium`) with no network:

    python docs/screenshots.py            # after `make study`, with `lmpipe server` running

docs/screenshots/report.png         reports/study.html, the study report
docs/screenshots/scaling-report.png reports/scaling.html, the scaling study (when `lmpipe scaling` has run)
docs/screenshots/dvc-plots.png      `dvc plots show`'s page (drawn offline from reports/plots_template.html)
docs/screenshots/validation.png     reports/validation/index.html, the corpus gate's data docs (offline: no CDN)
docs/screenshots/mlflow-models.png  the link `lmpipe ui` prints for the current models, best test bpb first
docs/screenshots/mlflow-runs.png    the MLflow runs view `lmpipe ui` links first, the headline metrics as columns
docs/screenshots/mlflow-compare.png the MLflow compare view of the runs that trained the current models
docs/screenshots/prefect-run.png    the Prefect flow run page of the newest evaluate run (its log lines and artifact)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs/screenshots"
sys.path.insert(0, str(ROOT))

from lmpipe.telemetry import switch_off  # noqa: E402

switch_off()  # before MLflow loads (model_runs) and for the servers started here


def shoot(url: str, out: Path, width: int = 1400, height: int = 2400, wait_ms: int = 20000,
          profile: Path | None = None) -> None:
    browser = shutil.which("chromium") or sys.exit("needs Debian's chromium: apt-get install chromium")
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--disable-background-networking", "--disable-component-update", "--disable-sync",
                    "--no-first-run", "--hide-scrollbars", f"--window-size={width},{height}",
                    *([f"--user-data-dir={profile}"] if profile else []),
                    f"--virtual-time-budget={wait_ms}", f"--screenshot={out}", url],
                   check=True, capture_output=True, timeout=300)
    if out.parent == OUT:
        print(f"{out.relative_to(ROOT)}: {url[:100]}")


# MLflow's UI opens its Assistant panel by itself on a browser's first visit to a local server; a user closes it
# once and the browser remembers (these two localStorage entries). The screenshots show the page after that.
CLOSED_ASSISTANT = """<script>
localStorage.setItem("mlflow.assistant.panelOpen_v1", "false");
localStorage.setItem("mlflow.assistant.fab.autoOpenedOnFirstLoad_v1", "true");
document.write("assistant closed");
</script>"""


def close_assistant(port: int, profile: Path) -> None:
    """Store the closed panel in `profile` for the origin 127.0.0.1:`port`, served here before MLflow takes the port."""
    import http.server
    import threading

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(CLOSED_ASSISTANT.encode())

        def log_message(self, *args):
            pass

    with http.server.HTTPServer(("127.0.0.1", port), Page) as page:
        threading.Thread(target=page.serve_forever, daemon=True).start()
        with tempfile.TemporaryDirectory() as scratch:
            shoot(f"http://127.0.0.1:{port}/", Path(scratch) / "setup.png", 400, 300, 2000, profile)
        page.shutdown()


def ui_links(port: int) -> tuple[subprocess.Popen, dict]:
    """`lmpipe ui` on `port` and the links it prints, by what each shows: {"runs", "models", "compare"}."""
    ui = subprocess.Popen(["lmpipe", "ui", "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                          text=True, start_new_session=True)
    links = {}
    for line in ui.stdout:
        for name, marker in (("runs", "so far, best test bpb first: "), ("models", "holds, best test bpb first: "),
                             ("compare", "side by side, best first: ")):
            if marker in line:
                links[name] = line.split(marker, 1)[1].strip()
        if line.startswith("champions"):
            break
    if "models" not in links:
        os.killpg(ui.pid, signal.SIGTERM)
        sys.exit("lmpipe ui found no run of the models here: run the study first")
    return ui, links


def mlflow_views(port: int, profile: Path) -> None:
    close_assistant(port, profile)  # its closed connections linger in TIME_WAIT, which lmpipe ui's port check ignores
    ui, links = ui_links(port)
    try:
        shoot(links["models"], OUT / "mlflow-models.png", 1400, 700, profile=profile)
        shoot(links["runs"], OUT / "mlflow-runs.png", 1600, 1000, profile=profile)
        shoot(links["compare"], OUT / "mlflow-compare.png", 2000, 2200, profile=profile)
    finally:
        os.killpg(ui.pid, signal.SIGTERM)


def prefect_run(api: str) -> None:
    runs = json.loads(urllib.request.urlopen(urllib.request.Request(
        f"{api}/flow_runs/filter", method="POST", headers={"Content-Type": "application/json"},
        data=json.dumps({"flow_runs": {"name": {"any_": ["evaluate"]}, "state": {"type": {"any_": ["COMPLETED"]}}},
                         "sort": "START_TIME_DESC", "limit": 1}).encode()), timeout=10).read())
    if not runs:
        sys.exit(f"no completed evaluate flow run on {api}: run the study with `lmpipe server` running")
    shoot(f"{api.removesuffix('/api')}/runs/flow-run/{runs[0]['id']}", OUT / "prefect-run.png", 1600, 1400, 30000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mlflow-port", type=int, default=5055)
    parser.add_argument("--prefect-api", default=os.environ.get("PREFECT_API_URL", "http://127.0.0.1:4200/api"))
    args = parser.parse_args()
    os.chdir(ROOT)
    OUT.mkdir(exist_ok=True)
    shoot((ROOT / "reports/study.html").as_uri(), OUT / "report.png", 1200, 5200)
    if (ROOT / "reports/scaling.html").exists():
        shoot((ROOT / "reports/scaling.html").as_uri(), OUT / "scaling-report.png", 1200, 4200)
    shoot((ROOT / "reports/validation/index.html").as_uri(), OUT / "validation.png", 1200, 1100)
    with tempfile.TemporaryDirectory() as plots:
        subprocess.run(["dvc", "plots", "show", "--out", plots], check=True, capture_output=True)
        shoot((Path(plots) / "index.html").as_uri(), OUT / "dvc-plots.png", 1400, 1900)
    with tempfile.TemporaryDirectory() as profile:
        mlflow_views(args.mlflow_port, Path(profile))
    prefect_run(args.prefect_api)


if __name__ == "__main__":
    main()
