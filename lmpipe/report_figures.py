"""The study report's figures: test bpb per model, the learning curves, and "As compute grows" (the grid's frontier
above the study's models stopped early). Drawing only: the numbers come computed, and lmpipe.figures saves each
legible at the page's width."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import numpy as np  # noqa: E402

from lmpipe import figures, stats  # noqa: E402
from lmpipe.paths import BASELINE  # noqa: E402
from lmpipe.compute_curves import FamilyFit, sd_at  # noqa: E402


def _times_power_of_ten(x: float, _position=None) -> str:
    """A log axis's tick as '2×10¹²': short enough that 1, 2 and 5 per decade fit side by side."""
    mantissa, exponent = f"{x:.0e}".split("e")
    return f"{mantissa}×10$^{{{int(exponent)}}}$"


def learning_curves_figure(curves: dict, baseline_bpb: float | None, out: Path, label: str) -> None:
    """Validation bpb per model against epochs (left) and against cumulative training FLOPs (right, log):
    the second puts every family on the axis of compute, where equal x means equal work."""
    fig, (by_epoch, by_flops) = plt.subplots(1, 2, figsize=(8.7, 3.8), sharey=True)
    for name, rows in curves.items():
        by_epoch.plot([r["epoch"] for r in rows], [r["valid_bpb"] for r in rows], marker="o", markersize=3, label=name)
        if "flops" in rows[0]:
            by_flops.plot([r["flops"] for r in rows], [r["valid_bpb"] for r in rows], marker="o", markersize=3,
                          label=name)
    for ax in (by_epoch, by_flops):
        if baseline_bpb:
            ax.axhline(baseline_bpb, color="gray", linestyle="--", label=f"{label} n-gram (baseline)")
        ax.grid(alpha=0.3)
    by_epoch.set(xlabel="epoch", ylabel="validation bits per byte (lower is better)", title="Learning curves")
    by_flops.set(xlabel="cumulative training FLOPs (log scale)", xscale="log", title="Validation bpb against compute")
    by_flops.xaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    by_flops.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(_times_power_of_ten))
    by_flops.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # 1, 2, 5 per decade: more would collide
    by_epoch.legend(loc="upper right")  # where the curves have ended: the epochs differ, the FLOPs do not
    figures.save(fig, out)


def bpb_figure(spreads: dict, out: Path, label: str) -> None:
    """Test bits per byte per model, best first, as dots with ± one seed sd where seeds give one, on an axis that
    spans the models (not from 0: the gaps that decide the verdicts are a few hundredths); the baseline a dashed
    line through the plot."""
    names = sorted((n for n in spreads if n != BASELINE), key=lambda n: spreads[n].bpb)
    fig, ax = plt.subplots(figsize=(7, 0.42 * len(names) + 1.4))
    values = [spreads[n].bpb for n in names]
    ax.errorbar(values, range(len(names)), xerr=[spreads[n].bpb_sd or 0.0 for n in names], fmt="o", color="tab:blue",
                capsize=4)
    for i, n in enumerate(names):
        ax.annotate(f"{values[i]:.3f}", (values[i], i), textcoords="offset points", xytext=(0, 7), ha="center")
    if BASELINE in spreads:
        ax.axvline(spreads[BASELINE].bpb, color="gray", linestyle="--",
                   label=f"{label} baseline {spreads[BASELINE].bpb:.3f}")
        ax.legend(loc="best")  # where it hides no model
    ax.set_yticks(range(len(names)), names)
    ax.set_ylim(len(names) - 0.5, -0.7)  # best on top, room for its label
    ax.set(xlabel="test bits per byte (lower is better; bars: ± 1 seed sd)", title="Test bits per byte")
    ax.grid(axis="x", alpha=0.3)
    figures.save(fig, out)


def compute_figure(points: dict[str, list[dict]], sds: dict[str, dict[float, float]],
                   baseline: tuple[str, float] | None, out: Path, front: dict[str, list[dict]] | None = None,
                   fits: dict[str, FamilyFit] | None = None) -> None:
    """With the grid's frontier, two panels: each family's best grid size per budget (validation bpb, ± seed sd,
    its curve dashed where its form survives the test), and the study's models stopped early (test bpb, with the
    seed band, the n-gram's level across); without it, the second alone."""
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


def position_figure(curves: dict, out: Path, label: str) -> None:
    """Test loss against the tokens read in the window (log x, as Kaplan et al. Fig. 7): each model's mean over bins
    of positions that double in width (lmpipe.context_use.Curve.bins), ± two of a bin's sds, the n-gram dashed;
    each position's own loss faint behind, with a band of ± one seed sd where seeds give one. The first position
    (nothing read, 10-13 nats) sits above the axis, whose range is that of the bins after it (the faint positions
    beyond it are cut)."""
    fig, ax = plt.subplots(figsize=(7.0, 3.9))
    shown = []
    for name, curve in curves.items():
        baseline = name == BASELINE
        x = np.arange(len(curve.nats))
        (line,) = ax.plot(x[1:], curve.nats[1:], linewidth=0.6, alpha=0.25, color="gray" if baseline else None)
        if curve.sd is not None:
            ax.fill_between(x[1:], (curve.nats - curve.sd)[1:], (curve.nats + curve.sd)[1:], color=line.get_color(),
                            alpha=0.15)
        bins = curve.bins()[1:]
        centres = [np.sqrt(a * (b - 1)) if b - a > 1 else a for a, b, _, _ in bins]
        means, sds = np.array([m for _, _, m, _ in bins]), np.array([sd for _, _, _, sd in bins])
        ax.errorbar(centres, means, yerr=2 * sds, marker="o", markersize=4, capsize=2, color=line.get_color(),
                    linestyle="--" if baseline else "-", label=f"{label} n-gram" if baseline else name)
        shown += [*(means - 2 * sds), *(means + 2 * sds)]
    ax.set_xscale("log")
    ax.set_ylim(min(shown) - 0.05, max(shown) + 0.05)
    ax.set(xlabel="tokens read before the position in the window", ylabel="test loss (nats per token)",
           title="Loss by context position (bins of positions doubling in width, ± 2 sd)")
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    figures.save(fig, out)
