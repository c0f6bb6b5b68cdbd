"""MediaWiki XML dumps to clean articles, with gensim's dump tools doing the parsing.

gensim's `filter_wiki` leaves a little markup behind (emphasis quotes, `==Heading==` lines, list
bullets); three named regexes take those away. Nothing else here parses wiki markup.
"""

from __future__ import annotations

import bz2
import re
from pathlib import Path
from typing import Iterator

from gensim.corpora.wikicorpus import extract_pages, filter_wiki

from lmpipe.corpus.articles import Article
from lmpipe.errors import CorpusError

EMPHASIS_QUOTES = re.compile(r"'{2,}")  # ''italic'', '''bold'''
HEADING = re.compile(r"^\s*(=+)\s*(.*?)\s*\1\s*$")  # ==History== -> History
LIST_BULLET = re.compile(r"^[*#:;]+\s*")  # * item, # item, : indent
REDIRECT = re.compile(r"^\s*#redirect", re.IGNORECASE)


def clean_paragraphs(wikitext: str) -> tuple[str, ...]:
    """Markup-free paragraphs, one per non-empty line."""
    paragraphs = []
    for line in filter_wiki(wikitext).splitlines():
        line = LIST_BULLET.sub("", HEADING.sub(r"\2", EMPHASIS_QUOTES.sub("", line)))
        line = " ".join(line.split())
        if line:
            paragraphs.append(line)
    return tuple(paragraphs)


def _open_dump(path: Path):
    if path.suffix == ".bz2":
        return bz2.open(path, "rb")
    return open(path, "rb")


def iter_wiki_articles(path: str | Path, min_words: int = 50, max_articles: int | None = None) -> Iterator[Article]:
    """Stream articles of a pages-articles dump (bz2 or plain XML), dropping redirects and stubs."""
    path = Path(path)
    kept = 0
    try:
        with _open_dump(path) as stream:
            for title, text, _pageid in extract_pages(stream, filter_namespaces=("0",)):
                if REDIRECT.match(text):
                    continue
                article = Article(" ".join(title.split()), clean_paragraphs(text))
                if article.words < min_words:
                    continue
                yield article
                kept += 1
                if max_articles is not None and kept >= max_articles:
                    return
    except (OSError, EOFError, SyntaxError) as exc:  # bz2 errors are OSError; XML errors are SyntaxError subclasses
        raise CorpusError(
            f"{path}: not a readable MediaWiki XML dump ({exc.__class__.__name__}: {exc}); "
            "point corpus.url at a pages-articles .xml or .xml.bz2 dump"
        ) from None
