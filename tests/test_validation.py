"""The Great Expectations gate passes clean text and names the split of every problem it finds."""

from __future__ import annotations

import re

import pytest

from lmpipe.config import ValidateParams
from lmpipe.corpus.articles import format_articles, split_by_article
from lmpipe.validation import OFFLINE_STYLE, corpus_tables, validate_corpus

PARAMS = ValidateParams(min_words=100, max_oov_rate=0.6)


@pytest.fixture()
def clean_dir(tmp_path, sample_articles):
    splits = split_by_article(sample_articles, 0.2, 0.2, seed=0)
    directory = tmp_path / "clean"
    directory.mkdir()
    for name, articles in splits.items():
        (directory / f"{name}.txt").write_text(format_articles(articles), encoding="utf-8")
    return directory


def test_clean_corpus_passes_and_builds_data_docs(clean_dir, tmp_path):
    report = validate_corpus(clean_dir, PARAMS, tmp_path / "docs")
    assert report["success"], report["failures"]
    assert report["evaluated"] == 12 and report["failed"] == 0
    assert (tmp_path / "docs" / "index.html").exists()
    pages = sorted((tmp_path / "docs" / "validations").rglob("*.html"))
    assert len(pages) == 3
    # offline (no CDN scripts), the index still lists each validation with its status and a link to its page
    index = re.sub(r"<script.*?</script>", "", (tmp_path / "docs" / "index.html").read_text(), flags=re.S)
    for page in pages:
        link = page.relative_to(tmp_path / "docs").as_posix()
        assert f'<td><a href="{link}">Success</a></td>' in index
    assert index.count("<tr>") == 3 + 3 + 2  # 3 validations, 3 suites, 2 header rows
    assert all(OFFLINE_STYLE in page.read_text() for page in [tmp_path / "docs" / "index.html", *pages])
    for page in (tmp_path / "docs").rglob("*.html"):  # nothing leaves the machine, and no made-up time is shown
        text = page.read_text()
        remote = re.findall(r"<(?:script|link|img)[^>]*\s(?:src|href)=\"https?://[^\"]*\"", text)
        assert not remote, (page, remote[:3])
        shown = re.sub(r"<script.*?</script>", "", text, flags=re.S)
        assert "2000-01-01" not in shown and ">20000101T000000.000000Z<" not in shown, page


def test_markup_residue_fails_naming_split_and_count(clean_dir, tmp_path):
    with open(clean_dir / "valid.txt", "a") as f:
        f.write(" = Broken = \nSee [[Link]] and {{template}} here.\nAnd [[another]].\n\n")
    report = validate_corpus(clean_dir, PARAMS, tmp_path / "docs")
    assert not report["success"]
    link = [f for f in report["failures"] if "no markup residue '[['" in f]
    assert len(link) == 1 and "2 of" in link[0] and "[valid: 2]" in link[0]
    assert any("'{{'" in f and "1 of" in f and "[valid: 1]" in f for f in report["failures"])


def test_article_in_two_splits_fails(clean_dir, tmp_path):
    train = (clean_dir / "train.txt").read_text()
    first = train.split("\n\n")[0] + "\n\n"
    with open(clean_dir / "test.txt", "a") as f:
        f.write(first)
    report = validate_corpus(clean_dir, PARAMS, tmp_path / "docs")
    failed = [r for r in report["results"] if not r["success"]]
    assert [(r["table"], r["expectation"]) for r in failed] == [("articles", "expect_column_values_to_be_unique")]
    assert "test: 1" in report["failures"][0] and "train: 1" in report["failures"][0]


def test_small_split_and_bad_utf8_fail(clean_dir, tmp_path):
    (clean_dir / "test.txt").write_bytes(" = Tiny = \ntoo few words \xff\xfe here\n\n".encode("latin-1"))
    report = validate_corpus(clean_dir, PARAMS, tmp_path / "docs")
    text = " | ".join(report["failures"])
    words = next(f for f in report["failures"] if f.startswith("splits.words"))
    assert words.startswith("splits.words: values >= 100: 1 of 3 rows [test: 1]")
    assert words.endswith("(change validate.min_words in params.yaml, or fix the corpus)")
    assert "lines.utf8_ok" in text and "[test: 1]" in text


def test_tables_count_words_per_split(clean_dir):
    tables = corpus_tables(clean_dir)
    for split in ("train", "valid", "test"):
        words = len((clean_dir / f"{split}.txt").read_text().split())
        assert tables["splits"].set_index("split").loc[split, "words"] == words
    assert tables["splits"].set_index("split").loc["train", "oov_rate"] == 0
