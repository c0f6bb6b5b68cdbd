"""Paths that two flows share (one writes, another reads): each written once, here. dvc.yaml is the map of every
stage's inputs and outputs; tests/test_graph.py holds these to it."""

from pathlib import Path

RUNS = Path("scaling/runs.csv")  # the scaling grid's rows: written by `grid`, fitted by `fit`
