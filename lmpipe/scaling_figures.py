"""The scaling report's figures: every run against compute with each family's frontier, the IsoFLOP profiles, and
the fitted law's contours. Drawing only: the fits come computed (lmpipe.scaling), and lmpipe.figures saves each
legible at the page's width."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from lmpipe import figures, stats  # noqa: E402
from lmpipe.scaling import Law  # noqa: E402


COLOURS = {"transformer": "tab:blue", "lstm": "tab:red", "gru": "tab:green", "rnn": "tab:orange", "nplm": "tab:purple"}


def _colour(model: str, k: int) -> str:
    return COLOURS.get(model, f"C{k}")


def _by_model(rows: list[dict]) -> dict[str, list[dict]]:
    models: dict[str, list[dict]] = {}
    for r in rows:
        models.setdefault(r["model"], []).append(r)
    return models


def _panels(n: int, width: float, height: float, **shared):
    """A figure of `n` panels, at most two a row, so that the page shows it at its own size and its text legible (five
    families read in three rows, not one 28-inch strip); the unused ones hidden. (figure, the n axes in order)."""
    cols = min(n, 2)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False, **shared)
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def loss_vs_compute_figure(rows: list[dict], baseline: tuple[str, float] | None, out: Path) -> None:
    """Every run's valid bpb against its training FLOPs; per family the compute-efficient frontier (its best run
    at each budget) as a line; the n-gram baseline (label, valid bpb) as a dashed line."""
    fig, ax = plt.subplots(figsize=(8, 4.8))
    for k, (model, runs) in enumerate(_by_model(rows).items()):
        colour = _colour(model, k)
        sizes = sorted({float(r["n_params"]) for r in runs})
        ax.scatter([float(r["flops"]) for r in runs], [float(r["valid_bpb"]) for r in runs], color=colour, alpha=0.55,
                   s=[18 + 60 * sizes.index(float(r["n_params"])) / max(1, len(sizes) - 1) for r in runs],
                   label=f"{model} runs (marker size: N)")
        best = stats.lowest(runs, lambda r: float(r["budget"]))
        ax.plot(*zip(*((float(b["flops"]), float(b["valid_bpb"])) for _, b in sorted(best.items()))), color=colour,
                label=f"{model} frontier (best run per budget)")
    if baseline:
        ax.axhline(baseline[1], color="gray", linestyle="--", label=f"{baseline[0]} n-gram ({baseline[1]:.3f})")
    ax.set(xscale="log", xlabel="training FLOPs C (log scale)", ylabel="validation bits per byte (lower is better)",
           title="Loss against compute")
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    figures.save(fig, out)


def isoflop_figure(rows: list[dict], analysis: dict, out: Path) -> None:
    """Per family, loss against N at each budget with the parabola through the best run and its neighbours, and its
    minimum (IsoFLOP profiles)."""
    models = _by_model(rows)
    fig, axes = _panels(len(models), 4.3, 3.6, sharey=True)
    for ax, (model, runs) in zip(axes, models.items()):
        budgets = sorted({float(r["budget"]) for r in runs})
        cmap = plt.get_cmap("viridis")
        for j, point in enumerate(analysis[model]["isoflop"]):
            colour = cmap(j / max(1, len(budgets) - 1))
            at = sorted((r for r in runs if float(r["budget"]) == point["budget"]), key=lambda r: float(r["n_params"]))
            n = np.array([float(r["n_params"]) for r in at])
            ax.plot(n, [float(r["valid_bpb"]) for r in at], "o", color=colour, label=f"C = {point['budget']:.1e}")
            if point["bracketed"]:  # the parabola over the three runs it went through
                grid = np.exp(np.linspace(*np.log(point["span"]), 50))
                ax.plot(grid, np.polyval(point["coefficients"], np.log(grid)), color=colour, alpha=0.7)
            ax.plot(point["n_opt"], point["loss_opt"], "*" if point["bracketed"] else "x", color=colour, markersize=12)
        ax.set(xscale="log", xlabel="parameters N (log scale)", title=f"{model}: IsoFLOP profiles")
        ax.grid(alpha=0.3, which="both")
        ax.legend()
    for ax in axes[::2]:
        ax.set_ylabel("validation bits per byte")
    figures.save(fig, out)


def law_contours_figure(rows: list[dict], analysis: dict, out: Path) -> None:
    """Per family, contours of the fitted L(N, D) over the grid's N and D, the runs, and the compute-optimal line."""
    models = _by_model(rows)
    fig, axes = _panels(len(models), 4.3, 3.8)
    for ax, (model, runs) in zip(axes, models.items()):
        law = Law(**analysis[model]["law"])
        n, d = np.array([float(r["n_params"]) for r in runs]), np.array([float(r["tokens"]) for r in runs])
        ns = np.exp(np.linspace(np.log(n.min() / 2), np.log(n.max() * 2), 80))
        ds = np.exp(np.linspace(np.log(d.min() / 2), np.log(d.max() * 2), 80))
        grid_n, grid_d = np.meshgrid(ns, ds)
        contours = ax.contour(grid_n, grid_d, law.loss(grid_n, grid_d), levels=12, cmap="viridis_r")
        ax.clabel(contours, fmt="%.2f")
        ax.scatter(n, d, c="black", s=12, label="runs")
        budgets = np.exp(np.linspace(np.log(6 * ns[0] * ds[0]), np.log(6 * ns[-1] * ds[-1]), 50))
        opt = np.array([law.optimal_n(c) for c in budgets])
        keep = (opt >= ns[0]) & (opt <= ns[-1]) & (budgets / (6 * opt) >= ds[0]) & (budgets / (6 * opt) <= ds[-1])
        ax.plot(opt[keep], budgets[keep] / (6 * opt[keep]), color="tab:red", label="compute-optimal N, D of the fit")
        ax.set(xscale="log", yscale="log", xlabel="parameters N", ylabel="training tokens D",
               title=f"{model}: fitted L(N, D) in bpb")
        ax.legend()
    figures.save(fig, out)
