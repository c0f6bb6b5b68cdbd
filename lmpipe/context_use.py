"""How each model uses its context, from its loss by position (plots/position.csv, `python -m flows.position`):
where the curve levels off and how much the window's second half still gains. Computing only: lmpipe.report words
it and lmpipe.report_figures draws it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lmpipe.io import csv_records

LEVEL_NATS = 0.02  # a curve has levelled off where its running mean stays this close to its level at the window's end
RUNNING = 8  # positions in the running mean: one position's mean over the test windows is noisy on its own


@dataclass(frozen=True)
class Curve:
    """One model's loss by position: the mean over its seeds at each position, their sd (None with one seed)."""

    model: str
    nats: np.ndarray
    sd: np.ndarray | None
    seeds: int
    identity: str  # of the training that made the model scored
    trained_on: str  # its machine and precision

    @property
    def end_level(self) -> float:
        """The loss where the window ends: the mean over its last quarter."""
        return float(self.nats[-max(1, len(self.nats) // 4):].mean())

    @property
    def levels_off_at(self) -> int:
        """The first position from which the running mean stays within LEVEL_NATS of the end level."""
        width = min(RUNNING, len(self.nats))
        running = np.convolve(self.nats, np.ones(width) / width, mode="valid")
        outside = np.flatnonzero(np.abs(running - self.end_level) > LEVEL_NATS)
        return int(outside[-1]) + 1 if len(outside) else 0

    @property
    def late_gain(self) -> float:
        """What the window's second half still gains: the mean over its second quarter less the end level."""
        quarter = max(1, len(self.nats) // 4)
        return float(self.nats[quarter:2 * quarter].mean()) - self.end_level


def read_curves(path: str | Path) -> dict[str, Curve]:
    """Every model's curve in the CSV, in its order; none where there is no CSV."""
    if not Path(path).exists():
        return {}
    by_model: dict[str, list[dict]] = {}
    for row in csv_records(path):
        by_model.setdefault(row["model"], []).append(row)
    curves = {}
    for model, rows in by_model.items():
        rows.sort(key=lambda r: int(r["position"]))
        sd = [float(r["sd"]) for r in rows if r["sd"] != ""]
        curves[model] = Curve(model, np.array([float(r["nats"]) for r in rows]),
                              np.array(sd) if len(sd) == len(rows) else None, int(rows[0]["seeds"]),
                              rows[0].get("identity", ""), rows[0].get("trained_on", ""))
    return curves


def current(curves: dict[str, Curve], identities: dict[str, str]) -> tuple[dict[str, Curve], list[str]]:
    """The curves of the models as they are (a curve's identity is its model's now; one of a model that records
    none, the n-gram's, always), and the models of `identities` whose curve was made from another training (stale)
    or is missing. A curve of a model no longer in the study is neither."""
    fresh = {name: c for name, c in curves.items()
             if (c.identity == identities[name] if name in identities else not c.identity)}
    return fresh, [name for name in identities if name not in fresh]
