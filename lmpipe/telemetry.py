"""Telemetry off, by the entry points that run the tools: stages and the `lmpipe` command (flows/__init__.py), the
tests (tests/conftest.py), the scripts that import MLflow or Prefect. `import lmpipe` itself changes no setting."""

from __future__ import annotations

import os
from typing import MutableMapping

# Read by Prefect, MLflow, DVC, Great Expectations, the HF hub and Ray when they load their settings: set before.
TELEMETRY_OFF = {
    "DO_NOT_TRACK": "true",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DVC_NO_ANALYTICS": "1",
    "GX_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_CLOUD_ENABLE_ORCHESTRATION_TELEMETRY": "false",
    "HF_HUB_OFFLINE": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
}


def switch_off(environ: MutableMapping[str, str] = os.environ) -> None:
    """Telemetry off for this process and the ones it starts (a value the user set stays)."""
    for key, value in TELEMETRY_OFF.items():
        environ.setdefault(key, value)
