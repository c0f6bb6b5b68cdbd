"""Articles and the clean text format: ` = Title = `, its paragraphs one per line, a blank line.

The WikiText convention, so article identity survives into validation and evaluation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from lmpipe.errors import CorpusError

TITLE = re.compile(r"^ = (?!=)(.*?) = $")


@dataclass(frozen=True)
class Article:
    title: str | None
    paragraphs: tuple[str, ...]

    @property
    def words(self) -> int:
        return sum(len(p.split()) for p in self.paragraphs)

    def to_text(self) -> str:
        head = [f" = {self.title} = "] if self.title is not None else []
        return "\n".join(head + list(self.paragraphs)) + "\n\n"


def format_articles(articles: Iterable[Article]) -> str:
    return "".join(a.to_text() for a in articles)


def parse_articles(text: str) -> Iterator[Article]:
    """Inverse of `format_articles`: blank lines end articles; a ` = Title = ` line names one."""
    for block in re.split(r"\n[ \t]*\n", text):
        lines = [line for line in block.split("\n") if line.strip()]
        if not lines:
            continue
        match = TITLE.match(lines[0])
        if match:
            yield Article(match.group(1), tuple(lines[1:]))
        else:
            yield Article(None, tuple(lines))


def read_articles(path: str | Path) -> list[Article]:
    path = Path(path)
    try:
        return list(parse_articles(path.read_text(encoding="utf-8")))
    except UnicodeDecodeError as exc:
        raise CorpusError(f"{path}: not valid UTF-8 (byte {exc.start}); re-encode it as UTF-8") from None


def split_by_article(articles: list[Article], valid: float, test: float, seed: int) -> dict[str, list[Article]]:
    """Seeded split by whole articles; valid/test get about their share of the words.

    Articles are shuffled, then dealt to test until it holds its share of words, then to valid;
    the rest is train. Each split keeps the source's order, and no article lands in two splits.
    """
    if len(articles) < 3:
        raise CorpusError(
            f"the corpus has {len(articles)} article(s); at least 3 are needed to split train/valid/test "
            "(raise corpus.max_articles or use a larger source)"
        )
    words = np.array([a.words for a in articles], dtype=np.int64)
    order = np.random.default_rng(seed).permutation(len(articles))
    total = words.sum()
    assignment = np.zeros(len(articles), dtype=np.int8)  # 0 train, 1 valid, 2 test
    filled = {1: 0, 2: 0}
    targets = {2: test * total, 1: valid * total}
    for index in order[:-1]:  # the last article always stays for train
        for split in (2, 1):
            if filled[split] < targets[split] or filled[split] == 0:
                assignment[index] = split
                filled[split] += words[index]
                break
        else:
            break
    if not (assignment == 0).any():
        raise CorpusError("the split left no article for train (lower split.valid / split.test)")
    return {
        name: [a for a, s in zip(articles, assignment) if s == code]
        for name, code in (("train", 0), ("valid", 1), ("test", 2))
    }
