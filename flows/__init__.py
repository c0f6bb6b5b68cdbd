"""Prefect flows, one per DVC stage: parse params, call lmpipe, log to MLflow, write outputs."""

import lmpipe  # noqa: F401  (switches telemetry off before Prefect and MLflow read their settings)
from flows.server import use_running_server

use_running_server()
