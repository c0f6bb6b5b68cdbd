"""data/raw -> data/clean/{train,valid,test}.txt plus the corpus statistics of metrics/corpus.json."""

from __future__ import annotations

import json
from pathlib import Path

from lmpipe.config import CorpusParams, SplitParams
from lmpipe.corpus.articles import Article, format_articles, read_articles, split_by_article
from lmpipe.corpus.sources import MANIFEST, SPLITS
from lmpipe.corpus.wiki import iter_wiki_articles
from lmpipe.corpus.wikitext import read_wikitext_zip
from lmpipe.errors import CorpusError
from lmpipe.io import atomic_path, sha256_file


def load_splits(raw_dir: Path, corpus: CorpusParams, split: SplitParams) -> dict[str, list[Article]]:
    manifest_path = raw_dir / MANIFEST
    if not manifest_path.exists():
        raise CorpusError(f"{manifest_path}: missing (run the download stage first: dvc repro download)")
    manifest = json.loads(manifest_path.read_text())
    if manifest["source"] != corpus.source:
        raise CorpusError(
            f"{manifest_path}: holds source {manifest['source']!r} but corpus.source is {corpus.source!r} "
            "(re-run the download stage)"
        )
    name = next(iter(manifest["files"]))  # single-file sources: the dump or the archive
    if corpus.source in ("enwiki-sample", "wikipedia-dump"):
        articles = list(iter_wiki_articles(raw_dir / name, corpus.min_article_words, corpus.max_articles))
        return split_by_article(articles, split.valid, split.test, split.seed)
    if corpus.source == "local":
        splits = {s: read_articles(raw_dir / f"{s}.txt") for s in SPLITS}
    else:
        splits = read_wikitext_zip(raw_dir / name)
    if corpus.max_articles is not None:
        splits = {s: arts[: corpus.max_articles] for s, arts in splits.items()}
    return splits


def split_stats(text: str, articles: list[Article]) -> dict:
    return {
        "articles": len(articles),
        "lines": text.count("\n"),
        "words": len(text.split()),
        "chars": len(text),
    }


def prepare_corpus(raw_dir: str | Path, clean_dir: str | Path, corpus: CorpusParams, split: SplitParams) -> dict:
    """Write the clean splits (directory replaced atomically) and return metrics/corpus.json's content."""
    splits = load_splits(Path(raw_dir), corpus, split)
    for name, articles in splits.items():
        if not any(a.paragraphs for a in articles):
            raise CorpusError(
                f"{raw_dir}: the {name} split has no text after cleaning (check the corpus files / corpus.max_articles)"
            )
    stats, hashes = {}, {}
    with atomic_path(clean_dir) as tmp:
        tmp.mkdir()
        for name, articles in splits.items():
            text = format_articles(articles)
            (tmp / f"{name}.txt").write_text(text, encoding="utf-8")
            stats[name] = split_stats(text, articles)
            hashes[f"{name}.txt"] = sha256_file(tmp / f"{name}.txt")
    return {"splits": stats, "source": corpus.source, "sha256": hashes}
