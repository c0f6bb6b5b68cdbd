"""The downloader against a real HTTP server on 127.0.0.1: resume, retries, 404, checksums."""

from __future__ import annotations

import hashlib

import pytest

from lmpipe.config import CorpusParams
from lmpipe.corpus.download import download, partial_path
from lmpipe.corpus.sources import fetch_corpus
from lmpipe.errors import DownloadError
from tests.helpers import QuietHandler, http_server, section

PAYLOAD = bytes(range(256)) * 4096  # 1 MiB


class Handler(QuietHandler):
    """Serves PAYLOAD at /data.bin with Range support; /flaky.bin drops the first response half-way."""

    ranges: list = []
    requests: list = []
    flaky_drops = 0

    def do_GET(self):
        Handler.requests.append(self.path)
        if self.path not in ("/data.bin", "/flaky.bin"):
            self.send_error(404, "Not Found")
            return
        start = 0
        header = self.headers.get("Range")
        Handler.ranges.append(header)
        if header:
            start = int(header.removeprefix("bytes=").split("-")[0])
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(PAYLOAD) - 1}/{len(PAYLOAD)}")
        else:
            self.send_response(200)
        body = PAYLOAD[start:]
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.path == "/flaky.bin" and Handler.flaky_drops > 0:
            Handler.flaky_drops -= 1
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.connection.shutdown(2)  # drop the connection mid-body
            return
        self.wfile.write(body)


@pytest.fixture()
def server():
    Handler.ranges, Handler.requests = [], []
    with http_server(Handler) as base:
        yield base


def test_download_verifies_and_renames(server, tmp_path):
    digest = hashlib.sha256(PAYLOAD).hexdigest()
    dest = tmp_path / "out" / "data.bin"
    got = download(f"{server}/data.bin", dest, cache_dir=tmp_path / "cache", sha256=digest, progress=False)
    assert got == digest
    assert dest.read_bytes() == PAYLOAD
    assert list((tmp_path / "cache").iterdir()) == []  # the partial file became the output


def test_dropped_connection_resumes_with_range(server, tmp_path):
    Handler.flaky_drops = 1
    dest = tmp_path / "flaky.bin"
    download(f"{server}/flaky.bin", dest, cache_dir=tmp_path / "cache", backoff=0.01, progress=False)
    assert dest.read_bytes() == PAYLOAD
    assert Handler.ranges[0] is None
    assert Handler.ranges[1] == f"bytes={len(PAYLOAD) // 2}-"  # resumed, not restarted


def test_partial_file_from_an_earlier_run_is_resumed(server, tmp_path):
    url = f"{server}/data.bin"
    part = partial_path(url, tmp_path / "cache")
    part.parent.mkdir(parents=True)
    part.write_bytes(PAYLOAD[:1000])
    download(url, tmp_path / "data.bin", cache_dir=tmp_path / "cache", progress=False)
    assert (tmp_path / "data.bin").read_bytes() == PAYLOAD
    assert Handler.ranges == ["bytes=1000-"]


def test_404_is_a_clear_error_and_not_retried(server, tmp_path):
    with pytest.raises(DownloadError, match=r"HTTP 404 .*check corpus.url") as info:
        download(f"{server}/missing.bin", tmp_path / "x.bin", cache_dir=tmp_path / "cache", progress=False)
    assert "\n" not in str(info.value)
    assert Handler.requests == ["/missing.bin"]  # a permanent error is not retried
    assert not (tmp_path / "x.bin").exists()


def test_connection_refused_retries_then_fails(tmp_path):
    from tests.helpers import free_port

    url = f"http://127.0.0.1:{free_port()}/data.bin"
    with pytest.raises(DownloadError, match="failed after 3 attempts"):
        download(url, tmp_path / "x.bin", cache_dir=tmp_path / "cache", retries=2, backoff=0.01, progress=False)


def test_wrong_sha256_leaves_nothing_in_raw(server, tmp_path):
    corpus = CorpusParams(**section("corpus", source="wikipedia-dump", url=f"{server}/data.bin", sha256="0" * 64))
    raw = tmp_path / "data" / "raw"
    with pytest.raises(DownloadError, match="sha256 mismatch"):
        fetch_corpus(corpus, raw, tmp_path / "cache")
    assert not raw.exists()
    assert list((tmp_path / "data").iterdir()) == []  # no temp directory left either
    assert list((tmp_path / "cache").iterdir()) == []  # the bad bytes are not kept for resuming


def test_manifest_records_computed_hash_without_sha256(server, tmp_path):
    corpus = CorpusParams(**section("corpus", source="wikipedia-dump", url=f"{server}/data.bin"))
    manifest = fetch_corpus(corpus, tmp_path / "raw", tmp_path / "cache")
    entry = manifest["files"]["data.bin"]
    assert entry["sha256"] == hashlib.sha256(PAYLOAD).hexdigest()
    assert entry["bytes"] == len(PAYLOAD)
    assert (tmp_path / "raw" / "manifest.json").exists()
