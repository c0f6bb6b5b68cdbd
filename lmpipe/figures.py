"""Saving the reports' figures legible at the width they are shown: the HTML reports show a figure at most PAGE_PX
wide (their text column), so a wide figure is scaled down, and its small print with it. `save` raises every text of
a figure to at least MIN_PX on the page, whatever size its drawing code asked for."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.text import Text  # noqa: E402

DPI = 110  # pixels per inch of the saved PNG
PAGE_PX = 960  # the reports' text column (lmpipe.html_page's max-width): a wider PNG is shown scaled down
MIN_PX = 11  # the smallest text a reader reads without zooming


def shown_px(points: float, width_in: float) -> float:
    """How tall a `points`-sized text is on the page, in CSS pixels, in a figure `width_in` inches wide."""
    scale = min(1.0, PAGE_PX / (width_in * DPI))
    return points * DPI / 72 * scale


def legible_points(width_in: float) -> float:
    """The smallest font size (points) that shows at least MIN_PX tall in a figure `width_in` inches wide."""
    return MIN_PX / shown_px(1.0, width_in)


def save(fig, out: str | Path) -> None:
    """Raise every text of `fig` that would show below MIN_PX to the legible size, lay the figure out again, save it
    as PNG and close it."""
    smallest = legible_points(fig.get_figwidth())
    fig.canvas.draw()  # makes the ticks a figure draws, so that their labels are sized too
    for ax in fig.axes:
        for axis, labels in (("x", ax.get_xticklabels(which="both")), ("y", ax.get_yticklabels(which="both"))):
            if any(label.get_fontsize() < smallest for label in labels):
                ax.tick_params(axis=axis, which="both", labelsize=smallest)
    for text in fig.findobj(Text):
        if text.get_text() and text.get_fontsize() < smallest:
            text.set_fontsize(smallest)
    fig.tight_layout()
    fig.savefig(out, dpi=DPI)
    plt.close(fig)
