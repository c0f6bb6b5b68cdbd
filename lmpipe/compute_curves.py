"""The report's "As compute grows": the compute-optimal answer from the scaling grid, and the study's models
stopped early.

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

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lmpipe import stats
from lmpipe.tables import markdown_table

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


def fraction(budget: float, c: float | None) -> str:
    """A budget as a share of the study's budget C: 'C/64', 'C/2.83', 'C'."""
    if not c:
        return f"{budget:.2e} FLOPs"
    ratio = c / budget
    return "C" if abs(ratio - 1) < 0.01 else f"C/{ratio:.3g}" if ratio > 1 else f"{1 / ratio:.3g} C"


def _value(p: dict) -> str:
    return f"{p['bpb']:.3f}" + (f" ± {p['sd']:.3f}" if stats.known(p["sd"]) else "")


def _verdict(real: bool | None) -> str:
    return "no seed sd to judge it" if real is None else "a real gap" if real else "within noise"


def ranking_line(at: dict[str, dict]) -> str:
    """The families best first at one budget, in words: each next one with whether its gap to the one before is
    real (beyond twice the larger seed sd), within noise, or not judged (a point of one run has no sd)."""
    order = sorted(at, key=lambda m: at[m]["bpb"])
    if not any(stats.known(p["sd"]) for p in at.values()):
        return ", then ".join(f"{m} {_value(at[m])}" for m in order) + " (one run a point: no gap judged)"
    parts = [f"{order[0]} {_value(at[order[0]])}"]
    for better, worse in zip(order, order[1:]):
        b, w = at[better], at[worse]
        parts.append(f"then {worse} {_value(w)} ({_verdict(stats.gap_is_real(b['bpb'], b['sd'], w['bpb'], w['sd']))})")
    return ", ".join(parts)


def _by_budget(front: dict[str, list[dict]]) -> dict[float, dict[str, dict]]:
    out: dict[float, dict[str, dict]] = {}
    for model, rows in front.items():
        for p in rows:
            out.setdefault(p["budget"], {})[model] = p
    return dict(sorted(out.items()))


def leads(front: dict[str, list[dict]]) -> list[tuple[float, str, float, bool | None]]:
    """At each budget with the transformer and a recurrent family: (budget, the best recurrent family, its bpb
    minus the transformer's (positive: the transformer is better), whether that gap is real)."""
    out = []
    for budget, at in _by_budget(front).items():
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


def crossing_lines(front: dict[str, list[dict]], fits: dict[str, FamilyFit], c: float | None) -> list[str]:
    """A line per measured flip of two families' order (`measured_flips`): where the two frontier curves cross
    inside it (every crossing there) when both forms survive their tests, else the two budgets it lies between."""
    lines = []
    for (a, pa), (b, pb) in itertools.combinations(sorted(front.items()), 2):
        for lo, hi in measured_flips(pa, pb):
            where = f"between {fraction(lo, c)} ({lo:.2e}) and {fraction(hi, c)} ({hi:.2e} FLOPs)"
            at = crossings(fits[a].curve, fits[b].curve, lo, hi) if fits[a].usable and fits[b].usable else []
            lines.append(f"- {a} and {b} change places {where}" + (
                f"; their curves cross at {', '.join(f'{x:.2e}' for x in at)} FLOPs" if at else ""))
    return lines


def frontier_section(scaling: dict, c: float | None, stale: Sequence[str] = (), samples: int = stats.SAMPLES,
                     seed: int = 0) -> tuple[list[str], dict[str, list[dict]], dict[str, FamilyFit]]:
    """The compute-optimal answer in lines (with the frontier and its fits, for the figure)."""
    if stale:
        return ([f"The scaling grid was trained from other {', '.join(stale)} than this study, so it does not answer "
                 "for it (run `lmpipe scaling` again)."], {}, {})
    front = frontier_points(scaling)
    fits = {m: fit_family(rows, samples, seed) for m, rows in front.items()}
    budgets = sorted({p["budget"] for rows in front.values() for p in rows})
    top = budgets[-1]
    reach = (f"The grid reaches the study's budget C = {c:.2e} FLOPs." if c and top >= 0.99 * c else
             f"The grid stops at {fraction(top, c)} ({top:.2e} FLOPs), below the study's budget C"
             + (f" = {c:.2e} FLOPs" if c else "") + ": no grid point measures the ranking at C itself.")
    lines = ["Which family is best at each compute budget, each at its own best size: the scaling grid "
             "(reports/scaling.md) trains several sizes of every family at each budget, and a family's point is its "
             "best size there, the mean of its seeds where it has several (± their sd). Validation bits per byte "
             "(lower is better). A gap is real when it is more than twice the larger seed sd; a point of one run "
             f"has no sd, so no gap to it is judged. {reach}", "",
             "Ranking at each budget (validation bpb):", ""]
    lines += [f"- {fraction(b, c)} ({b:.2e} FLOPs): {ranking_line(at)}" for b, at in _by_budget(front).items()]
    lead = leads(front)
    if lead:
        lines += ["", f"The transformer's lead over the best recurrent family (its validation bpb minus the "
                  "transformer's; positive: the transformer is better):", ""]
        lines += [f"- {fraction(b, c)}: {gap:+.3f} over {best} ({_verdict(real)})" for b, best, gap, real in lead]
    lines += ["", "A curve L(C) = E + A (C / C_max)^-alpha through each family's points, tested for lack of fit "
              "against the seed replicates (the means' distance from the curve against the spread between seeds); "
              "a rejected form (p below 0.05) gives no interval and places no crossing. Intervals from a bootstrap over "
              "the seed replicates, refitting each draw:", ""]
    lines += [fits[m].text(m) for m in front]
    flips = crossing_lines(front, fits, c)
    lines += ["", "Where two families change places inside the measured budgets (the order flips beyond noise):", "",
              *(flips or ["- nowhere: no two families' order flips beyond noise between budgets that judge it"])]
    return lines, front, fits


# ---------------- the study's models stopped early ----------------

def sd_at(sds: dict[str, dict[float, float]], name: str, budget: float) -> float:
    """The seed sd of `name`'s annealed test bpb at `budget`; nan where no seeds measured it."""
    return sds.get(name, {}).get(budget, math.nan)


def ranking(points: dict[str, list[dict]], sds: dict[str, dict[float, float]], c: float | None = None) -> list[str]:
    """A line per budget: the study's models best first by test bpb, in words (`ranking_line`)."""
    by_budget: dict[float, dict[str, dict]] = {}
    for name, rows in points.items():
        for r in rows:
            sd = sd_at(sds, name, r["budget_flops"])
            by_budget.setdefault(r["budget_flops"], {})[name] = {"bpb": r["test_bpb"],
                                                                  "sd": sd if math.isfinite(sd) else None}
    return [f"- {fraction(b, c)} ({b:.2e} FLOPs): {ranking_line(at)}" for b, at in sorted(by_budget.items())]


def compute_figure(points: dict[str, list[dict]], sds: dict[str, dict[float, float]],
                   baseline: tuple[str, float] | None, out: Path, front: dict[str, list[dict]] | None = None,
                   fits: dict[str, FamilyFit] | None = None) -> None:
    """With the grid's frontier, two panels: each family's best grid size per budget (validation bpb, ± seed sd,
    its curve dashed where its form survives the test), and the study's models stopped early (test bpb, with the
    seed band, the n-gram's level across); without it, the second alone."""
    import matplotlib.pyplot as plt

    from lmpipe import figures

    panels = 2 if front else 1
    fig, axes = plt.subplots(panels, 1, figsize=(8.6, 4.2 * panels), squeeze=False)  # one above the other: page-wide
    colours = {}
    if front:
        ax = axes[0][0]
        for name, rows in front.items():
            c = np.array([p["budget"] for p in rows])
            y = np.array([p["bpb"] for p in rows])
            sd = np.array([p["sd"] if stats.known(p["sd"]) else 0.0 for p in rows])
            line = ax.errorbar(c, y, yerr=sd, marker="o", capsize=2, label=name)
            colours[name] = line[0].get_color()
            if fits and fits[name].usable:
                span = np.geomspace(c.min(), c.max(), 50)
                ax.plot(span, fits[name].curve(span), linestyle="--", color=colours[name], linewidth=1)
        ax.set(xscale="log", xlabel="training FLOPs (log scale)", ylabel="validation bits per byte (lower is better)",
               title="Each family at its best size (the scaling grid)")
        ax.grid(alpha=0.3)
        ax.legend()
    ax = axes[-1][0]
    for name, rows in points.items():
        c = np.array([r["train_flops"] for r in rows])
        y = np.array([r["test_bpb"] for r in rows])
        (line,) = ax.plot(c, y, marker="o", label=name, color=colours.get(name))
        sd = np.array([sd_at(sds, name, r["budget_flops"]) for r in rows])
        if np.isfinite(sd).any():  # no band where a budget has no sd
            ax.fill_between(c, y - sd, y + sd, color=line.get_color(), alpha=0.15, linewidth=0)
    if baseline:
        ax.axhline(baseline[1], color="gray", linestyle=":", label=f"{baseline[0]} n-gram")
    ax.set(xscale="log", xlabel="training FLOPs (log scale)", ylabel="test bits per byte (lower is better)",
           title="The study's models stopped early (one size each)")
    ax.grid(alpha=0.3)
    ax.legend()
    figures.save(fig, out)


def section(points: dict[str, list[dict]], sds: dict[str, dict[float, float]], baseline: tuple[str, float] | None,
            figure: Path, scaling: dict | None = None, stale: Sequence[str] = ()) -> list[str]:
    """The report's "As compute grows": the compute-optimal answer from the grid's frontier (`scaling`:
    metrics/scaling.json; `stale`: what it was trained from that differs now), then the study's models stopped
    early, a learning curve at fixed size."""
    c = max((r["budget_flops"] for rows in points.values() for r in rows), default=None)  # the study's budget
    lines = ["## As compute grows", ""]
    front, fits = None, None
    if scaling and "frontier" in scaling:
        answer, front, fits = frontier_section(scaling, c, stale)
        lines += ["### The compute-optimal answer: each family at its best size", "", *answer, ""]
    compute_figure(points, sds, baseline, figure, front, fits)
    lines += [f"![Loss against compute](figures/{figure.name})", "",
              "### The study's models stopped early: a learning curve at fixed size", "",
              "Each study model keeps the one size and the settings tuned for the full budget C, and is stopped early "
              "at a fraction of C: its learning rate, held constant for most of training, is brought down to zero "
              "over a short final stretch ending at that budget (a branch of the run; Hägele et al. 2024), which "
              "gives the loss a run of that budget from scratch would (tests/test_train.py). This shows how a model "
              "of one size improves with training, not which family is best at that compute: a smaller model "
              "trained to a small budget does better (the scaling grid's best sizes). So no curve is "
              "fitted to these points and no crossing is read from them. Test bits per byte, ± the seed sd where "
              "seeds measured it (`lmpipe seeds` with the branches).", "",
              "Ranking at each budget (test bpb):", "", *ranking(points, sds, c)]
    return lines


def _near(a: float, b: float, tolerance: float = 0.01) -> bool:
    return abs(a - b) <= tolerance * max(a, b)


def against_grid(points: dict[str, list[dict]], scaling: dict | None, stale: Sequence[str] = ()) -> list[str]:
    """The scaling grid's frontier (each family's best size at a budget, metrics/scaling.json) against the study's
    annealed points at the budgets both have: per budget each family's valid bpb in both and the two rankings. The
    grid trains apart from the study with its own recipe, so where the budgets do not meet nothing is compared; nor
    where it was made from other data or settings than the study's (`stale` names them: lmpipe.grid_record)."""
    if not scaling or "frontier" not in scaling:
        return []
    e = lambda x: f"{x:.2e}"  # noqa: E731
    grid, frontier = scaling["grid"], scaling["frontier"]
    budgets = sorted({row["budget"] for rows in frontier.values() for row in rows})
    seeded = scaling.get("seed_spread") or []  # the budgets whose points are means of several seeds
    seeds = (f"one seed a run but at {len(seeded)} of them, where a point is the mean of "
             f"{max(s['seeds'] for s in seeded)} seeds" if seeded else "one seed a run")
    name = (f"The scaling grid (reports/scaling.md: {', '.join(sorted(frontier))} at {len(budgets)} budgets from "
            f"{e(budgets[0])} to {e(budgets[-1])} FLOPs, several sizes each, {seeds}, its own recipe: "
            + ", ".join(f"{k} {v}" for k, v in grid["overrides"].items()) + ")")
    if stale:
        return [f"{name}: not compared, as it was trained from other {', '.join(stale)} than this study "
                "(run `lmpipe scaling` again)."]
    pairs = []  # (budget, model, study valid bpb, grid's best run)
    for model, rows in sorted(points.items()):
        for r in rows:
            best = next((g for g in frontier.get(model, []) if _near(g["budget"], r["budget_flops"])), None)
            if best is not None:
                pairs.append((best["budget"], model, r["valid_bpb"], best))
    if not pairs:
        return [f"{name}: not compared, as the study has no annealed result at its budgets (`study.branches` "
                "gives them)."]
    lines = [f"{name}, against the study's models stopped early at the budgets both have. Validation bpb: the study's "
             "model (one size, tuned at its largest budget) and the grid's best size (a size at the edge of the grid's "
             "sizes is marked *: the grid's optimum may lie beyond it).", ""]
    lines += markdown_table(
        ["C (FLOPs)", "model", "study", "grid's best size", "grid", "study − grid"],
        [[e(budget), model, f"{study:.4f}", f"{best['size']}{'*' if best['edge'] else ''} "
          f"({best['n_params'] / 1e6:.2f}M)", f"{best['valid_bpb']:.4f}", f"{study - best['valid_bpb']:+.4f}"]
         for budget, model, study, best in sorted(pairs, key=lambda p: (p[0], p[2]))])
    lines.append("")
    for budget in sorted({p[0] for p in pairs}):
        at = [p for p in pairs if p[0] == budget]
        if len(at) < 2:
            continue
        study_order = [p[1] for p in sorted(at, key=lambda p: p[2])]
        grid_order = [p[1] for p in sorted(at, key=lambda p: p[3]["valid_bpb"])]
        same = "the same order" if study_order == grid_order else "another order"
        lines.append(f"- At {e(budget)} FLOPs the study ranks {', then '.join(study_order)}; the grid's best sizes "
                     f"rank {', then '.join(grid_order)}: {same}.")
    gaps = [p[2] - p[3]["valid_bpb"] for p in pairs]
    ahead = sum(g > 0 for g in gaps)
    runs = ("the study one seed, the grid one or a mean of several"
            if any(_near(p[0], s["budget"]) for p in pairs for s in seeded) else "one seed each")
    lines.append(f"- The grid's best size is below the study's model at {ahead} of {len(gaps)} points (mean gap "
                 f"{np.mean(gaps):+.4f} bpb, study − grid): {runs}, so a gap within the study's seed sd is noise.")
    return lines
