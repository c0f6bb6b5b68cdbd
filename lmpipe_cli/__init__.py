"""The `lmpipe` command (lmpipe_cli/main.py) and the tools it drives: the local Prefect server, a team's servers,
the retrain and its schedule, the plan and progress of a run, restore, the MLflow UI, sampling, and the frozen
stages' commits. It runs the flows (flows/) and the library (lmpipe/); neither imports it.

Importing it imports `flows`, whose own import switches telemetry off and gives Prefect this checkout's home before
Prefect and MLflow load their settings: the same setup, done in one place."""

import flows  # noqa: F401
