"""Result tables as markdown, through pandas: the one writer of every table the reports, docs and README show."""

from __future__ import annotations

from typing import Iterable, Sequence


def markdown_table(header: Sequence[str], rows: Iterable[Sequence]) -> list[str]:
    """A table's lines through `DataFrame.to_markdown` (tabulate's pipe format: columns padded to one width, so the
    file reads as a table too). Each cell is shown as the caller formatted it, never parsed as a number and
    re-formatted."""
    import pandas as pd  # here, not at the top: most stages import compare.py, and with it this, for names alone

    frame = pd.DataFrame([[str(cell) for cell in row] for row in rows], columns=list(header), dtype=object)
    return frame.to_markdown(index=False, disable_numparse=True).splitlines()
