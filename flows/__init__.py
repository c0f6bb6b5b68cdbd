"""Prefect flows, one per DVC stage: parse params, call lmpipe, log to MLflow, write outputs.

This package is what the stages and the `lmpipe` command run, so importing it prepares the process before Prefect
and MLflow load their settings: telemetry off, and a running local Prefect server found (Prefect reads its API
address once, at import)."""

from lmpipe.telemetry import switch_off

switch_off()

from flows.server import use_running_server  # noqa: E402

use_running_server()
