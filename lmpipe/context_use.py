"""How each model uses its context, from its loss by position (plots/position.csv, `python -m flows.position`):
where the curve levels off and how much the window's second half still gains. Computing only: lmpipe.report words
it and lmpipe.report_figures draws it."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lmpipe.io import csv_records
from lmpipe.paths import BASELINE

LEVEL_SDS = 2.0  # a bin differs from the window's last one when their gap is more than this many sds of the gap


def doubling_bins(window: int) -> list[tuple[int, int]]:
    """[start, end) of the position bins 0, 1, 2-3, 4-7, ... up to the window's end: each bin twice as wide as the
    one before, so each averages enough positions to be read beside the next (one position's mean over the test
    windows scatters by ~0.1 nats with the tokens that happen to sit there). A last bin less than half as wide as
    the one before joins it."""
    bins, start = [(0, 1)], 1
    while start < window:
        bins.append((start, min(2 * start, window)))
        start *= 2
    if len(bins) > 2 and bins[-1][1] - bins[-1][0] < (bins[-2][1] - bins[-2][0]) / 2:  # a window past a power of
        bins[-2:] = [(bins[-2][0], window)]  # two: its few last positions join the bin before, not one of their own
    return bins


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
    def scatter(self) -> float:
        """How much one position's loss scatters about its neighbours': the sd over the window's second half (the
        tokens that sit at each position; where the curve still falls this counts its fall too, so errs wide)."""
        half = self.nats[len(self.nats) // 2:]
        return float(half.std(ddof=1)) if len(half) > 1 else 0.0

    def bins(self) -> list[tuple[int, int, float, float]]:
        """(start, end, mean loss, its sd) of each doubling bin: the sd is the scatter over the root of the width."""
        return [(a, b, float(self.nats[a:b].mean()), self.scatter / np.sqrt(b - a))
                for a, b in doubling_bins(len(self.nats))]

    @property
    def levels_off_at(self) -> int:
        """The first position from which no bin's loss differs from the last bin's by more than LEVEL_SDS sds of
        their gap: the model gains nothing measurable from the tokens it reads past it. The last bin's start when
        the bin before it is still higher beyond noise (the curve still falls as the window ends)."""
        *before, (last_start, _, last, last_sd) = self.bins()
        start = last_start
        for a, _, mean, sd in reversed(before):
            if abs(mean - last) > LEVEL_SDS * np.hypot(sd, last_sd):
                break
            start = a
        return start

    @property
    def late_gain(self) -> tuple[float, float]:
        """What the window's second half still gains, with its sd: the bin before the last less the last bin."""
        (_, _, earlier, earlier_sd), (_, _, last, last_sd) = self.bins()[-2:]
        return earlier - last, float(np.hypot(earlier_sd, last_sd))


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


def baseline_identity(evaluation: dict | None) -> str:
    """What identifies the n-gram scored, which has no training summary: its results in metrics/eval.json (another
    corpus, split or n-gram setting gives others; rounded, so a last bit's rounding is not another); '' where they
    are not there."""
    entry = (evaluation or {}).get("models", {}).get(BASELINE)
    return hashlib.sha256(json.dumps(_rounded(entry), sort_keys=True).encode()).hexdigest()[:16] if entry else ""


def _rounded(value):
    """Floats to 6 significant digits, all the way down: another CPU's last bit is not another n-gram."""
    if isinstance(value, float):
        return float(f"{value:.6g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return [_rounded(v) for v in value] if isinstance(value, list) else value


def current(curves: dict[str, Curve], identities: dict[str, str]) -> tuple[dict[str, Curve], list[str]]:
    """The curves of the models as they are (a curve's identity is its model's now; the n-gram's its results',
    `baseline_identity`), and the models of `identities` whose curve was made from another training or n-gram
    (stale) or is missing. A curve of a model no longer in the study is neither."""
    fresh = {name: c for name, c in curves.items() if name in identities and c.identity
             and c.identity == identities[name]}
    return fresh, [name for name in identities if name not in fresh]
