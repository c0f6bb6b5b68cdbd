"""The reports' figures are legible at the width the page shows them."""

import matplotlib.pyplot as plt
from matplotlib.text import Text

from lmpipe import figures


def shown_sizes(fig) -> list[float]:
    fig.canvas.draw()
    return [figures.shown_px(t.get_fontsize(), fig.get_figwidth())
            for t in fig.findobj(Text) if t.get_text() and t.get_visible()]


def test_a_wide_figure_scaled_to_the_page_keeps_every_text_at_least_the_minimum(tmp_path):
    fig, ax = plt.subplots(figsize=(12, 4))  # 1320 px, shown at 960: 8 pt text would show at 8.4 px
    ax.plot([1, 2, 3], [3, 1, 2], label="a curve")
    ax.legend(fontsize=6)
    ax.text(1, 1, "note", fontsize=7)
    ax.tick_params(labelsize=6)
    ax.set_title("title", fontsize=8)
    assert min(shown_sizes(fig)) < figures.MIN_PX
    figures.save(fig, tmp_path / "f.png")
    assert min(shown_sizes(fig)) >= figures.MIN_PX - 1e-9
    assert (tmp_path / "f.png").read_bytes()[:4] == b"\x89PNG"


def test_text_already_legible_is_left_as_drawn(tmp_path):
    fig, ax = plt.subplots(figsize=(6, 3))  # shown at its own size
    title = ax.set_title("title", fontsize=14)
    figures.save(fig, tmp_path / "f.png")
    assert title.get_fontsize() == 14
    assert figures.shown_px(8, 6) == 8 * figures.DPI / 72
