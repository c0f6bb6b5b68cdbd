"""The Great Expectations gate passes clean text and names the split of every problem it finds."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from lmpipe.config import ValidateParams
from lmpipe.corpus.articles import format_articles, split_by_article
from lmpipe.validation import corpus_tables, validate_corpus
from tests.helpers import section

PARAMS = ValidateParams(**section("validate", min_words=100, max_oov_rate=0.6))
CHROMIUM = shutil.which("chromium")


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
    index = (tmp_path / "docs" / "index.html").read_text()
    for page in pages:  # the index's table (bootstrap-table builds it in the browser) links each validation's page
        assert f"'_table_row_link_path': '{page.relative_to(tmp_path / 'docs').as_posix()}'" in index
    for page in (tmp_path / "docs").rglob("*.html"):  # nothing leaves the machine, and no made-up time is shown
        text = page.read_text()
        remote = re.findall(r"<(?:script|link|img)[^>]*\s(?:src|href)=\"https?://[^\"]*\"", text)
        assert not remote, (page, remote[:3])
        for asset in re.findall(r"<(?:script|link)[^>]*\s(?:src|href)=\"([^\"#]+)\"", text):  # each copy is there
            assert (page.parent / asset).is_file(), (page, asset)
        shown = re.sub(r"<script.*?</script>", "", text, flags=re.S)
        assert "2000-01-01" not in shown and ">20000101T000000.000000Z<" not in shown, page
        assert "newsletter" not in text
    styles = (tmp_path / "docs/static/styles/data_docs_default_styles.css").read_text()
    assert "https://" not in styles  # the dark mode's logo too


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


def browse(page: Path, scheme: str, tmp_path: Path) -> tuple[str, list[str], list[str]]:
    """`page` in headless Chromium, in the light or dark colour scheme: (its DOM once the scripts ran, the console's
    errors, every address the page asked the network for: Chromium's network log, less the browser's own requests,
    which no page initiates; a page's file:// loads never reach the network)."""
    netlog, profile = tmp_path / f"net-{scheme}.json", tmp_path / f"profile-{scheme}"
    done = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                           "--disable-background-networking", "--disable-component-update", "--no-first-run",
                           f"--user-data-dir={profile}", f"--log-net-log={netlog}", "--enable-logging=stderr",
                           "--v=0", f"--blink-settings=preferredColorScheme={0 if scheme == 'dark' else 1}",
                           *(["--force-dark-mode"] if scheme == "dark" else []), "--window-size=1400,1000",
                           "--virtual-time-budget=15000", "--dump-dom", page.as_uri()],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    text = netlog.read_text()
    try:
        events = json.loads(text)["events"]
    except ValueError:  # a log Chromium did not close: its events so far
        events = json.loads(text.rstrip().rstrip(",") + "]}")["events"]
    asked = {e["source"]["id"] for e in events if e.get("params", {}).get("initiator", "not an origin") != "not an origin"}
    urls = sorted({e["params"]["url"] for e in events if "url" in e.get("params", {}) and e["source"]["id"] in asked})
    return done.stdout, errors, urls


@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium)")
def test_the_data_docs_work_offline_in_a_browser_light_and_dark(clean_dir, tmp_path):
    """The index and a validation page in Chromium: no script error, the index's table built by bootstrap-table with
    a row per validation, and no request leaving the machine, in the light and the dark colour scheme."""
    validate_corpus(clean_dir, PARAMS, tmp_path / "docs")
    index = tmp_path / "docs" / "index.html"
    validation = next((tmp_path / "docs" / "validations").rglob("*.html"))
    for scheme in ("light", "dark"):
        for page in (index, validation):
            dom, errors, urls = browse(page, scheme, tmp_path)
            assert not errors, (page.name, scheme, errors[:3])
            assert not urls, (page.name, scheme, urls)
            if page == index:  # the scripts ran: bootstrap-table built the index's rows, a link to each validation
                for done in (tmp_path / "docs" / "validations").rglob("*.html"):
                    link = done.relative_to(tmp_path / "docs").as_posix()
                    assert f'<tr class="clickable-row" data-href="{link}"' in dom, (scheme, link)


def test_the_vendored_copies_are_the_bytes_gx_asks_its_cdns_for():
    """Where GX's templates pin an asset by its hash (subresource integrity), the copy in lmpipe/data/datadocs has
    that hash; and every CDN address GX's templates name is vendored or left out on purpose (Vega)."""
    import base64
    import hashlib

    import great_expectations

    from lmpipe.validation import VENDOR, VENDORED

    templates = Path(great_expectations.__file__).parent / "render" / "view" / "templates"
    tags = re.findall(r"<(?:script|link)[^>]*", "\n".join(p.read_text() for p in templates.glob("*.j2")))
    pinned = 0
    for tag in tags:
        address = re.search(r"(?:src|href)=\"(https?://[^\"]+)\"", tag)
        if not address or "greatexpectations.io" in address[1]:
            continue
        assert address[1] in VENDORED or "/npm/vega" in address[1], address[1]
        if (integrity := re.search(r"integrity=\"sha384-([^\"]+)\"", tag)) and address[1] in VENDORED:
            digest = base64.b64encode(hashlib.sha384((VENDOR / VENDORED[address[1]]).read_bytes()).digest()).decode()
            assert digest == integrity[1], address[1]
            pinned += 1
    assert pinned >= 2  # popper.js and bootstrap.js carry hashes in GX 1.x
