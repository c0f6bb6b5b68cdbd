"""WikiText raw files (` = Title = ` articles, ` = = Section = = ` headings) to clean articles."""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

from lmpipe.corpus.articles import Article
from lmpipe.errors import CorpusError

TITLE = re.compile(r"^ = (?!=)(.*?) = $")
SECTION = re.compile(r"^ (?:= )+(?!=)(.*?)(?: =)+ $")  # ` = = History = = ` -> History


def parse_wikitext(text: str) -> list[Article]:
    """Articles of one WikiText split; section headings become plain-text lines like the wiki source."""
    articles: list[Article] = []
    title, paragraphs = None, []
    for line in text.split("\n"):
        match = TITLE.match(line)
        if match:
            if title is not None or paragraphs:
                articles.append(Article(title, tuple(paragraphs)))
            title, paragraphs = match.group(1).strip(), []
            continue
        line = SECTION.sub(r"\1", line)
        line = " ".join(line.split())
        if line:
            paragraphs.append(line)
    if title is not None or paragraphs:
        articles.append(Article(title, tuple(paragraphs)))
    return articles


def read_wikitext_zip(path: str | Path) -> dict[str, list[Article]]:
    """The given train/valid/test splits of a wikitext-*-raw-v1.zip."""
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as archive:
            members = {Path(n).name: n for n in archive.namelist()}
            return {
                split: parse_wikitext(archive.read(members[f"wiki.{split}.raw"]).decode("utf-8"))
                for split in ("train", "valid", "test")
            }
    except (zipfile.BadZipFile, KeyError, UnicodeDecodeError) as exc:
        raise CorpusError(
            f"{path}: not a WikiText raw archive with wiki.{{train,valid,test}}.raw ({exc}); "
            "check corpus.url points at a wikitext-*-raw-v1.zip"
        ) from None
