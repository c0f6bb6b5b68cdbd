"""Cleaning, parsing and splitting: the real dump gensim ships, and small hand-made inputs."""

from __future__ import annotations

import bz2

import pytest

from lmpipe.config import CorpusParams, LocalFiles, SplitParams
from lmpipe.corpus.articles import Article, format_articles, parse_articles, split_by_article
from lmpipe.corpus.prepare import prepare_corpus
from lmpipe.corpus.sources import ENWIKI_SAMPLE, fetch_corpus
from lmpipe.corpus.wiki import clean_paragraphs, iter_wiki_articles
from lmpipe.corpus.wikitext import parse_wikitext
from lmpipe.errors import CorpusError
from tests.helpers import section

PAGE = """<page><title>{title}</title><ns>0</ns><id>{id}</id><revision><id>1</id>
<text xml:space="preserve">{text}</text></revision></page>"""


def write_dump(path, pages):
    body = "".join(PAGE.format(title=t, id=i, text=x) for i, (t, x) in enumerate(pages, 1))
    xml = f'<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/" xml:lang="en">{body}</mediawiki>'
    path.write_bytes(bz2.compress(xml.encode()))
    return path


def test_clean_paragraphs_strips_what_filter_wiki_leaves():
    text = ("'''Albedo''' is ''the'' [[reflectivity|reflecting power]] of a {{cite|x}}surface.\n"
            "==History==\n* first item\n# second item\n\n")
    assert clean_paragraphs(text) == (
        "Albedo is the reflecting power of a surface.", "History", "first item", "second item")


def test_dump_parsing_drops_redirects_and_stubs(tmp_path):
    words = " ".join(["word"] * 60)
    dump = write_dump(tmp_path / "d.xml.bz2", [
        ("Kept", f"'''Kept''' {words}"),
        ("Gone", "#REDIRECT [[Kept]]"),
        ("Stub", "too short"),
        ("Also kept", words),
    ])
    titles = [a.title for a in iter_wiki_articles(dump, min_words=50)]
    assert titles == ["Kept", "Also kept"]


def test_not_a_dump_is_a_clear_error(tmp_path):
    bad = tmp_path / "dump.xml.bz2"
    bad.write_bytes(b"this is not bzip2")
    with pytest.raises(CorpusError, match="not a readable MediaWiki XML dump"):
        list(iter_wiki_articles(bad))


def test_real_enwiki_sample_has_the_documented_size():
    articles = list(iter_wiki_articles(ENWIKI_SAMPLE))
    assert len(articles) == 106
    assert 470_000 < sum(a.words for a in articles) < 481_000
    assert articles[0].title == "Anarchism"


def test_clean_format_round_trips(sample_articles):
    text = format_articles(sample_articles)
    assert list(parse_articles(text)) == sample_articles
    assert text.count(" = Anarchism = \n") == 1


def test_split_is_seeded_disjoint_and_proportional(sample_articles):
    a = split_by_article(sample_articles, 0.2, 0.2, seed=1)
    assert a == split_by_article(sample_articles, 0.2, 0.2, seed=1)
    assert a != split_by_article(sample_articles, 0.2, 0.2, seed=2)
    titles = [{x.title for x in a[s]} for s in ("train", "valid", "test")]
    assert not (titles[0] & titles[1] or titles[0] & titles[2] or titles[1] & titles[2])
    assert sum(map(len, titles)) == len(sample_articles)
    total = sum(x.words for x in sample_articles)
    assert sum(x.words for x in a["train"]) > 0.3 * total
    assert all(a[s] for s in a)


def test_split_needs_three_articles():
    with pytest.raises(CorpusError, match="at least 3 are needed"):
        split_by_article([Article("a", ("x y",)), Article("b", ("z",))], 0.1, 0.1, 0)


def test_wikitext_headings_become_plain_lines():
    raw = " \n = Valkyria = \n \n Senjō no Valkyria 3 . \n \n = = Gameplay = = \n \n Play it . \n = Next = \n x \n"
    articles = parse_wikitext(raw)
    assert articles == [Article("Valkyria", ("Senjō no Valkyria 3 .", "Gameplay", "Play it .")),
                        Article("Next", ("x",))]


def test_prepare_on_real_sample_writes_splits_and_stats(tmp_path):
    corpus = CorpusParams(**section("corpus", max_articles=12))
    fetch_corpus(corpus, tmp_path / "raw", tmp_path / "cache")
    stats = prepare_corpus(tmp_path / "raw", tmp_path / "clean", corpus, SplitParams(**section("split", seed=3)))
    for split in ("train", "valid", "test"):
        text = (tmp_path / "clean" / f"{split}.txt").read_text()
        assert stats["splits"][split]["words"] == len(text.split())
        assert stats["splits"][split]["lines"] == text.count("\n")
    assert sum(s["articles"] for s in stats["splits"].values()) == 12
    assert stats["source"] == "enwiki-sample" and len(stats["sha256"]) == 3


@pytest.mark.parametrize("content, expected", [
    (b"", "is empty"),
    (b"   \n\n", "is empty"),
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "looks binary"),
    (b"caf\xe9 au lait\n", "is not valid UTF-8"),
])
def test_bad_local_files_fail_with_the_field_and_leave_nothing(tmp_path, content, expected):
    good = tmp_path / "good.txt"
    good.write_text(" = A = \nsome text here\n\n")
    bad = tmp_path / "bad.txt"
    bad.write_bytes(content)
    corpus = CorpusParams(**section("corpus", source="local", files=LocalFiles(train=str(good), valid=str(bad), test=str(good))))
    raw = tmp_path / "data" / "raw"
    with pytest.raises(CorpusError, match=f"corpus.files.valid: .*bad.txt {expected}"):
        fetch_corpus(corpus, raw, tmp_path / "cache")
    assert not (tmp_path / "data").exists() or list((tmp_path / "data").iterdir()) == []


def test_missing_local_file(tmp_path):
    corpus = CorpusParams(**section("corpus", source="local", files=LocalFiles(train="nope.txt", valid="nope.txt",
                                                                                  test="nope.txt")))
    with pytest.raises(CorpusError, match="corpus.files.train: nope.txt does not exist"):
        fetch_corpus(corpus, tmp_path / "raw", tmp_path / "cache")


def test_wikitext_source_downloads_and_keeps_given_splits(tmp_path):
    """wikitext-2 through the real code path, served from 127.0.0.1 as the public zip is laid out."""
    import http.server
    import zipfile

    from tests.helpers import http_server

    archive = tmp_path / "wikitext-2-raw-v1.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for split in ("train", "valid", "test"):
            z.writestr(f"wikitext-2-raw/wiki.{split}.raw",
                       f" \n = {split.title()} one = \n \n Text of {split} . \n \n = = Part = = \n \n More . \n"
                       f" \n = {split.title()} two = \n \n Second . \n")
    handler = lambda *a, **k: http.server.SimpleHTTPRequestHandler(*a, directory=str(tmp_path), **k)  # noqa: E731
    with http_server(handler) as base:
        corpus = CorpusParams(**section("corpus", source="wikitext-2", url=f"{base}/{archive.name}"))
        manifest = fetch_corpus(corpus, tmp_path / "raw", tmp_path / "cache")
    assert manifest["files"][archive.name]["bytes"] == archive.stat().st_size
    stats = prepare_corpus(tmp_path / "raw", tmp_path / "clean", corpus, SplitParams(**section("split")))
    assert (tmp_path / "clean" / "valid.txt").read_text() == (
        " = Valid one = \nText of valid .\nPart\nMore .\n\n = Valid two = \nSecond .\n\n")
    assert {s: v["articles"] for s, v in stats["splits"].items()} == {"train": 2, "valid": 2, "test": 2}


def test_local_source_keeps_the_users_splits(tmp_path):
    files = {}
    for split in ("train", "valid", "test"):
        files[split] = tmp_path / f"my-{split}.txt"
        files[split].write_text(f"First {split} paragraph.\nSecond line.\n\nAnother {split} block.\n")
    corpus = CorpusParams(**section("corpus", source="local", files=LocalFiles(**{k: str(v) for k, v in files.items()})))
    fetch_corpus(corpus, tmp_path / "raw", tmp_path / "cache")
    stats = prepare_corpus(tmp_path / "raw", tmp_path / "clean", corpus, SplitParams(**section("split")))
    assert (tmp_path / "clean" / "test.txt").read_text() == "First test paragraph.\nSecond line.\n\nAnother test block.\n\n"
    assert stats["splits"]["train"]["articles"] == 2


def test_local_sha256_is_of_the_three_files_concatenated(tmp_path):
    import hashlib

    from lmpipe.errors import DownloadError

    files = {s: tmp_path / f"{s}.txt" for s in ("train", "valid", "test")}
    for split, path in files.items():
        path.write_text(f"Some {split} text.\n")
    expected = hashlib.sha256(b"".join(files[s].read_bytes() for s in ("train", "valid", "test"))).hexdigest()
    good = CorpusParams(**section("corpus", source="local", files=LocalFiles(**{k: str(v) for k, v in files.items()}),
                                 sha256=expected))
    fetch_corpus(good, tmp_path / "raw", tmp_path / "cache")
    wrong = good.model_copy(update={"sha256": "0" * 64})
    with pytest.raises(DownloadError, match=f"corpus.files: sha256 of train\\+valid\\+test mismatch: expected {'0' * 64}, "
                                            f"got {expected} \\(fix corpus.sha256\\)"):
        fetch_corpus(wrong, tmp_path / "raw2", tmp_path / "cache")
    assert not (tmp_path / "raw2").exists()
