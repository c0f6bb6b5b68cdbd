"""`lmpipe ui`: the MLflow UI on this study's tracking store, and the links of its views.

A local store gets `mlflow ui` on 127.0.0.1, one worker and no job runner (a viewer needs neither), stopped with
this process (Ctrl-C or SIGTERM); a tracking server (a team's: `lmpipe team up`) is its own UI, so only the links
are printed.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from lmpipe_cli import server
from lmpipe.errors import LmpipeError, first_line


def open_ui(port: int, access_log: bool = False) -> int:
    """Serve the UI until Ctrl-C or SIGTERM (0), or until the server exits (its exit code); the links once it
    answers."""
    from lmpipe.config import load_params
    from lmpipe.tracking.store import relocate_store, tracking_uri

    uri, params, base = tracking_uri(), load_params(), f"http://{server.HOST}:{port}"
    if uri.startswith(("http://", "https://")):
        print(f"MLFLOW_TRACKING_URI={uri} is a tracking server, whose page is the MLflow UI: no local one started")
        print_views(uri.rstrip("/"), params)
        return 0
    if not server.port_free(port):
        raise LmpipeError(f"127.0.0.1:{port} is taken by another program (choose another: lmpipe ui --port N)")
    relocate_store()  # a copied or moved checkout: the UI serves this one's artifacts
    command = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", server.HOST,
               "--port", str(port), "--workers", "1",
               *([] if access_log else ["--uvicorn-opts", "--no-access-log"])]  # quiet: the links stay in view
    env = {**server.this_environment(), "MLFLOW_DISABLE_TELEMETRY": "true",
           "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    print(f"starting the MLflow UI over {uri} ...", flush=True)
    process = subprocess.Popen(command, env=env, start_new_session=True)  # its own group: stopped whole, below
    signal.signal(signal.SIGTERM, interrupt)  # a service manager's stop: as Ctrl-C
    try:
        deadline = time.monotonic() + 180
        while not server.healthy(base) and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        if process.poll() is None:
            print_views(base, params)
        return process.wait()
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the server (its own process group) stops below
        return 0
    except Exception as exc:  # the store failed us (e.g. locked by a running study): one line, and the UI goes too
        raise LmpipeError(f"the MLflow store {uri} did not answer as expected: {first_line(str(exc))}") from None
    finally:
        server.stop_group(process)


def print_views(base: str, params) -> None:
    """The links of the views of this study on the MLflow UI at `base`, and the champions."""
    from lmpipe import mlflow_views as views
    from lmpipe.compare import baseline_label
    from lmpipe.tracking.registry import champion_metrics

    experiment, label = params.tracking.experiment, baseline_label(params.ngram)
    every = views.every_published(experiment)
    if every:
        every_model = views.view_url(base, experiment, views.share(experiment, views.leaderboard_state(every, label)))
        print(f"MLflow UI, every model evaluated so far, best test bpb first: {every_model}", flush=True)
    else:
        print(f"MLflow UI: {base} (no study published yet: make study)", flush=True)
    runs = views.published_runs(experiment)
    if runs:
        best_first = views.view_url(base, experiment, views.share(experiment, views.leaderboard_state(runs, label)))
        print(f"the models this workspace holds, best test bpb first: {best_first}")
        chart = views.chart_url(base, experiment, views.share(experiment, views.chart_state(runs, label)))
        print(f"their test bpb as a chart, best first: {chart}")
        print("the runs that trained them, every setting and metric side by side, best first: "
              f"{views.compare_url(base, experiment, views.made_by(runs))}")
    crowned = champion_metrics(params.models)
    ranked = sorted(crowned, key=lambda m: crowned[m]["bpb"])
    print("champions (models:/lmpipe-<model>@champion), best first by the test bpb of the version's own run (the "
          "views and tables give the mean over seeds): "
          + (", ".join(f"{m} v{crowned[m]['version']} ({crowned[m]['bpb']:.3f})" for m in ranked)
             or "none yet (run the study)"), flush=True)


def interrupt(signum, frame) -> None:
    """SIGTERM handler: stop as Ctrl-C stops (KeyboardInterrupt), so every `finally` runs."""
    raise KeyboardInterrupt
