"""Prefect flows, one per DVC stage: parse params, call lmpipe, log to MLflow, write outputs.

This package is what the stages and the `lmpipe` command run, so importing it switches telemetry off and gives
Prefect this checkout's own home (flows._prefect.project_home) before Prefect and MLflow load their settings. It opens
no socket: the stage entry point (`flows._stage.main`) finds a running local Prefect server when it runs a flow."""

from lmpipe.telemetry import switch_off
from flows._prefect import use_project_home

switch_off()
use_project_home()
