"""Prefect flows, one per DVC stage: parse params, call lmpipe, log to MLflow, write outputs.

This package is what the stages and the `lmpipe` command run, so importing it switches telemetry off before
Prefect and MLflow load their settings. It opens no socket: the stage entry point (`flows._stage.main`) finds a
running local Prefect server when it runs a flow."""

from lmpipe.telemetry import switch_off

switch_off()
