"""The numbers behind the report's "As compute grows" (its words: lmpipe.as_compute_grows; its figure:
lmpipe.report_figures): the compute-optimal answer from the scaling grid, and the study's models stopped early.

The answer is the grid's frontier (metrics/scaling.json): each family's best size at each budget, a seed mean
where the point has seeds, ranked at each budget by the one gap rule (lmpipe.stats), with the transformer's lead
over the best recurrent family. A curve L(C) = E + A (C / C_max)^-alpha through each family's frontier is tested
for lack of fit against the seed replicates; only a form the test keeps places a crossing, and a crossing is listed
only inside the measured budgets, where the measured order of the two families flips beyond noise.

The study's decay branches (`study.branches`; each record of `metrics/train/<model>.json`'s `budgets`) are the
study's own models, sized and tuned for C, stopped early at fractions of C with their learning rate decayed there
(Hägele et al. 2024): a learning curve at fixed size, not each family at that compute, so no curve is fitted to them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lmpipe import stats

LEVEL = stats.LEVEL  # the intervals' coverage
RECURRENT = ("lstm", "gru", "rnn")  # families the transformer's lead is measured against


def annealed(trained: dict[str, dict]) -> dict[str, list[dict]]:
    """{model: its budget records, smallest budget first}, for the models trained with branches."""
    return {name: sorted(t["budgets"], key=lambda r: r["budget_flops"]) for name, t in trained.items()
            if t.get("budgets")}


# ---------------- a curve through a family's points ----------------

@dataclass(frozen=True)
class Curve:
    """L(C) = e + a (C / c_max)^-alpha, weighted least squares over a family's points."""

    e: float
    a: float
    alpha: float
    c_max: float

    def __call__(self, flops):
        return self.e + self.a * (np.asarray(flops, dtype=float) / self.c_max) ** -self.alpha

    @property
    def degenerate(self) -> bool:
        """A constant at the bound of its search: a floor E at 0 (the points place no irreducible loss) or an
        exponent at 0 or 5; its constants then say nothing."""
        return self.e <= 1e-6 or self.alpha <= 1e-6 or self.alpha >= 5 - 1e-6


def fit_curve(flops, bpb, weights=None) -> Curve | None:
    """The curve through at least four points (`weights`: each point's number of runs, so a seed mean counts as
    its runs); None when it does not converge (a flat or rising curve has no power law)."""
    from scipy import optimize

    c, y = np.asarray(flops, dtype=float), np.asarray(bpb, dtype=float)
    if len(c) < 4:
        return None
    sigma = None if weights is None else 1 / np.sqrt(np.asarray(weights, dtype=float))
    model = lambda x, e, a, alpha: e + a * x ** -alpha  # noqa: E731
    try:
        (e, a, alpha), _ = optimize.curve_fit(model, c / c.max(), y, p0=(0.9 * y.min(), max(y.max() - y.min(), 1e-3),
                                                                          0.3), sigma=sigma,
                                              bounds=([0.0, 0.0, 0.0], [y.min(), np.inf, 5.0]), maxfev=20000)
    except (RuntimeError, ValueError):
        return None
    return Curve(float(e), float(a), float(alpha), float(c.max()))


def crossings(first: Curve, second: Curve, lo: float, hi: float) -> list[float]:
    """Every budget in [lo, hi] where the two curves meet: each sign change of their gap, not only the first."""
    from scipy import optimize

    gap = lambda log_c: float(first(math.exp(log_c)) - second(math.exp(log_c)))  # noqa: E731
    grid = np.linspace(math.log(lo), math.log(hi), 129)
    values = [gap(g) for g in grid]
    found = []
    for (x0, v0), (x1, v1) in zip(zip(grid, values), zip(grid[1:], values[1:])):
        if v0 == 0:
            found.append(math.exp(x0))
        elif v0 * v1 < 0:
            found.append(math.exp(optimize.brentq(gap, x0, x1)))
    return found


def crossing(first: Curve, second: Curve, lo: float, hi: float) -> float | None:
    """The first of `crossings`, else None."""
    return next(iter(crossings(first, second, lo, hi)), None)


@dataclass(frozen=True)
class FamilyFit:
    """A family's frontier curve, its lack-of-fit test against the seed replicates and alpha's bootstrap interval
    over them (only for a form the test keeps)."""
    curve: Curve | None
    check: stats.LackOfFit | None
    alpha_interval: tuple[float, float] | None

    @property
    def usable(self) -> bool:
        """Neither rejected nor degenerate, so it may place a crossing and carry an interval."""
        return self.curve is not None and not self.curve.degenerate and not (self.check and self.check.rejected)

    def text(self, name: str) -> str:
        if self.curve is None:
            return f"- {name}: no power law fits its points"
        c = self.curve
        numbers = f"alpha {c.alpha:.2f}, E {c.e:.3f} bpb"
        if c.degenerate:
            return f"- {name}: degenerate ({numbers}: a constant sits at the bound of its search, so none is measured)"
        check = self.check.text() if self.check else "no lack-of-fit test (no point has several seeds)"
        if not self.usable:
            return f"- {name}: {numbers}; the form is {check}, so it gives no interval and places no crossing"
        band = (f" ({int(LEVEL * 100)}% interval {self.alpha_interval[0]:.2f} to {self.alpha_interval[1]:.2f})"
                if self.alpha_interval else "")
        return f"- {name}: alpha {c.alpha:.2f}{band}, E {c.e:.3f} bpb; the form is {check}"


def fit_family(points: list[dict], samples: int = stats.SAMPLES, seed: int = 0) -> FamilyFit:
    """The frontier curve of one family (`frontier_points`), tested and bootstrapped over its seed replicates."""
    c = [p["budget"] for p in points]
    reps = [p["replicates"] for p in points]
    weights = [len(r) for r in reps]
    curve = fit_curve(c, [float(np.mean(r)) for r in reps], weights)
    if curve is None:
        return FamilyFit(None, None, None)
    check = stats.lack_of_fit(reps, curve(c), 3)
    fit = FamilyFit(curve, check, None)
    if not fit.usable:
        return fit
    alphas = stats.bootstrap(reps, lambda y: getattr(fit_curve(c, y, weights), "alpha", None), samples, seed)
    return FamilyFit(curve, check, stats.interval(alphas) if alphas else None)


# ---------------- the grid's frontier ----------------

def frontier_points(scaling: dict) -> dict[str, list[dict]]:
    """{family: its frontier, smallest budget first}: per budget the best size's valid bpb (a seed mean where it
    has seeds), its sd (None for one run) and its runs."""
    out = {}
    for model, rows in sorted(scaling["frontier"].items()):
        out[model] = [{"budget": float(r["budget"]), "size": r["size"], "n_params": r["n_params"],
                       "bpb": float(r["valid_bpb"]), "sd": r.get("seed_sd"),
                       "replicates": r.get("replicates") or [float(r["valid_bpb"])]} for r in rows]
    return out


def by_budget(front: dict[str, list[dict]]) -> dict[float, dict[str, dict]]:
    """The frontier by budget, smallest first: {budget: {family: its point}}."""
    out: dict[float, dict[str, dict]] = {}
    for model, rows in front.items():
        for p in rows:
            out.setdefault(p["budget"], {})[model] = p
    return dict(sorted(out.items()))


def leads(front: dict[str, list[dict]]) -> list[tuple[float, str, float, bool | None]]:
    """At each budget with the transformer and a recurrent family: (budget, the best recurrent family, its bpb
    minus the transformer's (positive: the transformer is better), whether that gap is real)."""
    out = []
    for budget, at in by_budget(front).items():
        recurrent = [m for m in RECURRENT if m in at]
        if "transformer" not in at or not recurrent:
            continue
        best = min(recurrent, key=lambda m: at[m]["bpb"])
        t, r = at["transformer"], at[best]
        out.append((budget, best, r["bpb"] - t["bpb"], stats.gap_is_real(t["bpb"], t["sd"], r["bpb"], r["sd"])))
    return out


def measured_flips(a: list[dict], b: list[dict]) -> list[tuple[float, float]]:
    """The budget intervals (b_i, b_j) over which two families' measured order flips beyond noise: the order is
    judged at each budget both have (a real gap, by the seed sds), budgets within noise or without an sd skipped,
    and each change of the judged order between consecutive judged budgets is a flip."""
    mine, theirs = {p["budget"]: p for p in a}, {p["budget"]: p for p in b}
    judged = []
    for budget in sorted(set(mine) & set(theirs)):
        x, y = mine[budget], theirs[budget]
        if stats.gap_is_real(x["bpb"], x["sd"], y["bpb"], y["sd"]):
            judged.append((budget, x["bpb"] < y["bpb"]))
    return [(b0, b1) for (b0, s0), (b1, s1) in zip(judged, judged[1:]) if s0 != s1]


def grid_fits(scaling: dict | None, stale: Sequence[str] = (), samples: int = stats.SAMPLES,
              seed: int = 0) -> tuple[dict[str, list[dict]], dict[str, FamilyFit]]:
    """The grid's frontier and each family's fit through it; none where there is no frontier, or where the grid
    was trained from other data or settings than the study (`stale`), so it answers nothing for the study."""
    if not scaling or "frontier" not in scaling or stale:
        return {}, {}
    front = frontier_points(scaling)
    return front, {m: fit_family(rows, samples, seed) for m, rows in front.items()}


# ---------------- the study's models stopped early ----------------

def sd_at(sds: dict[str, dict[float, float]], name: str, budget: float) -> float:
    """The seed sd of `name`'s annealed test bpb at `budget`; nan where no seeds measured it."""
    return sds.get(name, {}).get(budget, math.nan)


def study_budget(points: dict[str, list[dict]]) -> float | None:
    """The study's budget C: the largest its models were stopped at."""
    return max((r["budget_flops"] for rows in points.values() for r in rows), default=None)
