"""The `lmpipe` command (lmpipe_cli/main.py) and the tools it drives: the local Prefect server, a team's servers,
the retrain and its schedule, the plan and progress of a run, restore, the MLflow UI, sampling, and the frozen
stages' commits. It runs the flows (flows/) and the library (lmpipe/); neither imports it.

Importing it switches telemetry off and gives Prefect this checkout's own home before Prefect and MLflow load their
settings, as importing `flows` does."""

from lmpipe.telemetry import switch_off
from flows._prefect import use_project_home

switch_off()
use_project_home()
