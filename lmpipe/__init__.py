"""lmpipe: a reproducible language-modelling study (library side: no orchestration here)."""

import os

__version__ = "0.1.0"

# No library may phone home: set before prefect, mlflow, dvc or great_expectations read their settings.
_TELEMETRY_OFF = {
    "DO_NOT_TRACK": "true",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DVC_NO_ANALYTICS": "1",
    "GX_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_CLOUD_ENABLE_ORCHESTRATION_TELEMETRY": "false",
    "HF_HUB_OFFLINE": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
}
for _key, _value in _TELEMETRY_OFF.items():
    os.environ.setdefault(_key, _value)
