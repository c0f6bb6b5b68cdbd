"""A report's Markdown as one self-contained HTML page, for the study report and the scaling report alike."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import markdown


def html_page(text: str, out_dir: Path, title: str) -> str:
    """A report's Markdown as one self-contained HTML page: its PNG figures (paths relative to `out_dir`) inlined."""
    html = markdown.markdown(text, extensions=["tables"])
    html = re.sub(r'src="([^":]+\.png)"', lambda m: 'src="data:image/png;base64,'
                  + base64.b64encode((out_dir / m.group(1)).read_bytes()).decode() + '"', html)
    # Text in a readable column; a wide table may take the window's width (centred on the column), and its cells wrap,
    # so every column shows at 1400 px; a scrollbar only where even that is too narrow.
    style = ("body{font-family:sans-serif;max-width:960px;margin:2em auto}img{max-width:100%;height:auto}"
             "table{border-collapse:collapse;display:block;overflow-x:auto;width:max-content;"
             "max-width:min(96vw,1320px);position:relative;left:50%;transform:translateX(-50%)}"
             "td,th{border:1px solid #ccc;padding:2px 6px;white-space:normal;font-size:0.92em}")
    return f"<!doctype html><meta charset='utf-8'><title>{title}</title><style>{style}</style>{html}"
