"""How the ranking moves with compute: each model's annealed results at several budgets, from decay branches of the
study's own runs (`study.branches`; each record of `metrics/train/<model>.json`'s `budgets`), a fitted
L(C) = E + A (C / C_max)^-alpha per model, the ranking at each budget and where two models' curves cross.

Every point is an annealed run (its own decay to its budget), not a mid-run point of the run at C, whose learning
rate has not decayed yet (Hägele et al. 2024). The families keep the settings tuned at C at every budget.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lmpipe.tables import markdown_table

LEVEL = 0.9  # the intervals' coverage
RECURRENT = ("lstm", "gru", "rnn")  # families the transformer's lead is measured against


def annealed(trained: dict[str, dict]) -> dict[str, list[dict]]:
    """{model: its budget records, smallest budget first}, for the models trained with branches."""
    return {name: sorted(t["budgets"], key=lambda r: r["budget_flops"]) for name, t in trained.items()
            if t.get("budgets")}


@dataclass(frozen=True)
class Curve:
    """L(C) = e + a (C / c_max)^-alpha, least squares over a model's annealed test bpb."""

    e: float
    a: float
    alpha: float
    c_max: float
    covariance: tuple  # of (e, a, alpha), from the fit
    alpha_interval: tuple[float, float]

    def __call__(self, flops):
        return self.e + self.a * (np.asarray(flops, dtype=float) / self.c_max) ** -self.alpha


def fit_curve(flops, bpb, level: float = LEVEL) -> Curve | None:
    """The curve through at least four points, alpha's `level` interval from the fit's covariance (Student's t with
    n - 3 degrees of freedom); None when it does not converge (a flat or rising curve has no power law)."""
    from scipy import optimize, stats

    c, y = np.asarray(flops, dtype=float), np.asarray(bpb, dtype=float)
    if len(c) < 4:
        return None
    x = c / c.max()
    model = lambda x, e, a, alpha: e + a * x ** -alpha  # noqa: E731
    try:
        (e, a, alpha), cov = optimize.curve_fit(model, x, y, p0=(0.9 * y.min(), max(y.max() - y.min(), 1e-3), 0.3),
                                                bounds=([0.0, 0.0, 0.0], [y.min(), np.inf, 5.0]), maxfev=20000)
    except (RuntimeError, ValueError):
        return None
    if not np.all(np.isfinite(cov)):
        return None
    half = stats.t.ppf(0.5 + level / 2, len(c) - 3) * math.sqrt(cov[2, 2])
    return Curve(float(e), float(a), float(alpha), float(c.max()), tuple(map(tuple, cov)),
                 (float(alpha - half), float(alpha + half)))


def crossing(first: Curve, second: Curve, lo: float, hi: float) -> float | None:
    """The budget in [lo, hi] where the two curves meet (the first one's sign change of the gap), else None."""
    from scipy import optimize

    gap = lambda log_c: float(first(math.exp(log_c)) - second(math.exp(log_c)))  # noqa: E731
    grid = np.linspace(math.log(lo), math.log(hi), 65)
    values = [gap(g) for g in grid]
    for (x0, v0), (x1, v1) in zip(zip(grid, values), zip(grid[1:], values[1:])):
        if v0 == 0:
            return math.exp(x0)
        if v0 * v1 < 0:
            return math.exp(optimize.brentq(gap, x0, x1))
    return None


def crossing_interval(first: Curve, second: Curve, lo: float, hi: float, samples: int = 400,
                      seed: int = 0) -> tuple[float, float] | None:
    """The `LEVEL` interval of the crossing over curves drawn from each fit's covariance (a parametric
    bootstrap); None when fewer than half the draws cross in [lo, hi]."""
    rng = np.random.default_rng(seed)
    found = []
    for _ in range(samples):
        drawn = []
        for curve in (first, second):
            e, a, alpha = rng.multivariate_normal([curve.e, curve.a, curve.alpha], np.array(curve.covariance))
            drawn.append(Curve(e, a, alpha, curve.c_max, curve.covariance, curve.alpha_interval))
        if (c := crossing(*drawn, lo, hi)) is not None:
            found.append(math.log(c))
    if len(found) < samples / 2:
        return None
    low, high = np.percentile(found, [50 * (1 - LEVEL), 50 * (1 + LEVEL)])
    return math.exp(low), math.exp(high)


def sd_at(sds: dict[str, dict[float, float]], name: str, budget: float) -> float:
    """The seed sd of `name`'s annealed test bpb at `budget`; nan where no seeds measured it."""
    return sds.get(name, {}).get(budget, math.nan)


def ranking(points: dict[str, list[dict]], sds: dict[str, dict[float, float]]) -> list[str]:
    """A line per budget: the models best first by test bpb, each gap marked real ('<': more than twice the larger
    seed sd at that budget) or not ('≈'); ',' where a seed sd is unknown."""
    budgets = sorted({r["budget_flops"] for rows in points.values() for r in rows})
    lines = []
    for budget in budgets:
        at = sorted((r["test_bpb"], name) for name, rows in points.items() for r in rows
                    if r["budget_flops"] == budget)
        parts = [f"{at[0][1]} {at[0][0]:.3f}"]
        for (better, b_name), (worse, w_name) in zip(at, at[1:]):
            sd = max(sd_at(sds, b_name, budget), sd_at(sds, w_name, budget))
            mark = "," if not math.isfinite(sd) else "<" if worse - better > 2 * sd else "≈"
            parts.append(f"{mark} {w_name} {worse:.3f}")
        lines.append(f"- {budget:.2e} FLOPs: " + " ".join(parts).replace(" ,", ","))
    return lines


def lead_sentence(points: dict[str, list[dict]]) -> str | None:
    """How the transformer's lead over the best recurrent model moves from the smallest budget to the largest: grows
    or closes only where it does so at every step, and the budgets where the transformer is ahead and behind."""
    recurrent = [m for m in points if m in RECURRENT]
    if "transformer" not in points or not recurrent:
        return None
    by_budget = {name: {r["budget_flops"]: r["test_bpb"] for r in rows} for name, rows in points.items()}
    budgets = sorted(set(by_budget["transformer"]).intersection(*(by_budget[m] for m in recurrent)))
    if len(budgets) < 2:
        return None
    leads = []
    for budget in budgets:
        best = min(recurrent, key=lambda m: by_budget[m][budget])
        leads.append((best, by_budget[best][budget] - by_budget["transformer"][budget]))
    steps = [b[1] - a[1] for a, b in zip(leads, leads[1:])]
    trend = ("grows" if all(d > 0 for d in steps) else "closes" if all(d < 0 for d in steps)
             else "moves both ways")
    each = ", ".join(f"{lead:+.3f} over {best} at {budget:.2e}" for budget, (best, lead) in zip(budgets, leads))
    sentence = (f"The transformer's lead over the best recurrent model {trend} from {budgets[0]:.2e} to "
                f"{budgets[-1]:.2e} FLOPs: {each} (positive: the transformer is better).")
    ahead = [f"{b:.2e}" for b, (_, lead) in zip(budgets, leads) if lead > 0]
    if ahead and len(ahead) < len(budgets):
        behind = [f"{b:.2e}" for b, (_, lead) in zip(budgets, leads) if lead <= 0]
        sentence += f" It is ahead at {', '.join(ahead)} and behind at {', '.join(behind)}."
    return sentence


def compute_figure(points: dict[str, list[dict]], curves: dict[str, Curve | None],
                   sds: dict[str, dict[float, float]], baseline: tuple[str, float] | None, out: Path) -> None:
    """Test bpb against training FLOPs: each model's annealed points with its seed band (± sd at each budget where
    seeds measured it), its fitted curve dashed, the n-gram's level across."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for name, rows in points.items():
        c = np.array([r["train_flops"] for r in rows])
        y = np.array([r["test_bpb"] for r in rows])
        (line,) = ax.plot(c, y, marker="o", label=name)
        sd = np.array([sd_at(sds, name, r["budget_flops"]) for r in rows])
        if np.isfinite(sd).any():  # no band where a budget has no sd
            ax.fill_between(c, y - sd, y + sd, color=line.get_color(), alpha=0.15, linewidth=0)
        if curves.get(name) is not None:
            span = np.geomspace(c.min(), c.max(), 50)
            ax.plot(span, curves[name](span), linestyle="--", color=line.get_color(), linewidth=1)
    if baseline:
        ax.axhline(baseline[1], color="gray", linestyle=":", label=f"{baseline[0]} n-gram")
    ax.set(xscale="log", xlabel="training FLOPs (log scale)", ylabel="test bits per byte (lower is better)",
           title="Annealed test bpb against compute")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def section(points: dict[str, list[dict]], sds: dict[str, dict[float, float]], baseline: tuple[str, float] | None,
            figure: Path) -> list[str]:
    """The report's "As compute grows": the figure, the ranking at each budget, each model's alpha with its
    interval, the crossings, and how the transformer's lead moves."""
    curves = {name: fit_curve([r["train_flops"] for r in rows], [r["test_bpb"] for r in rows])
              for name, rows in points.items()}
    compute_figure(points, curves, sds, baseline, figure)
    lo = min(r["train_flops"] for rows in points.values() for r in rows)
    hi = max(r["train_flops"] for rows in points.values() for r in rows)
    lines = ["## As compute grows", "",
             "Each model's annealed test bpb at every budget: a decay branch of its study run from the stable phase "
             "(wsd), which equals a run of that budget from scratch (tests/test_train.py), with the settings tuned "
             "at the largest budget. The band is ± the seed sd at each budget (`lmpipe seeds` with the branches; "
             "a budget without it has no band); '<' marks a gap beyond twice the larger sd there, '≈' one within it, "
             "',' one no sd judges.", "", f"![Annealed test bpb against compute](figures/{figure.name})",
             "", "Ranking at each budget (test bpb):", "", *ranking(points, sds), "",
             f"Fitted L(C) = E + A (C / C_max)^-alpha over each model's points ({int(LEVEL * 100)}% intervals):", ""]
    for name, curve in curves.items():
        lines.append(f"- {name}: alpha {curve.alpha:.2f} [{curve.alpha_interval[0]:.2f}, "
                     f"{curve.alpha_interval[1]:.2f}], E {curve.e:.3f} bpb" if curve is not None
                     else f"- {name}: no power law fits its points")
    crossed = []
    for (a, ca), (b, cb) in itertools.combinations([(n, c) for n, c in curves.items() if c is not None], 2):
        if (at := crossing(ca, cb, lo / 2, hi * 2)) is not None:
            band = crossing_interval(ca, cb, lo / 2, hi * 2)
            crossed.append(f"- {a} and {b} cross at {at:.2e} FLOPs"
                           + (f" [{band[0]:.2e}, {band[1]:.2e}]" if band else " (interval: too uncertain)"))
    lines += ["", f"Crossings of the fitted curves within {lo / 2:.1e} to {hi * 2:.1e} FLOPs:", "",
              *(crossed or ["- none: no two curves cross there"])]
    if sentence := lead_sentence(points):
        lines += ["", sentence]
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
    lines = [f"{name}, against the study's annealed points at the budgets both have. Validation bpb: the study's "
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
        lines.append(f"- At {e(budget)} FLOPs the study ranks {' < '.join(study_order)}; the grid's best sizes rank "
                     f"{' < '.join(grid_order)}: {same}.")
    gaps = [p[2] - p[3]["valid_bpb"] for p in pairs]
    ahead = sum(g > 0 for g in gaps)
    runs = ("the study one seed, the grid one or a mean of several"
            if any(_near(p[0], s["budget"]) for p in pairs for s in seeded) else "one seed each")
    lines.append(f"- The grid's best size is below the study's model at {ahead} of {len(gaps)} points (mean gap "
                 f"{np.mean(gaps):+.4f} bpb, study − grid): {runs}, so a gap within the study's seed sd is noise.")
    return lines
