"""Bring a corpus into data/raw/ by its `corpus.source`, with a manifest of every file's size and sha256."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from urllib.parse import urlparse

import gensim

from lmpipe.config import CorpusParams
from lmpipe.corpus.download import download
from lmpipe.errors import CorpusError, DownloadError
from lmpipe.io import atomic_path, sha256_file, write_json

ENWIKI_SAMPLE = (
    Path(gensim.__file__).parent
    / "test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
)
WIKITEXT_URLS = {
    "wikitext-2": "https://wikitext.smerity.com/wikitext-2-raw-v1.zip",
    "wikitext-103": "https://wikitext.smerity.com/wikitext-103-raw-v1.zip",
}
SPLITS = ("train", "valid", "test")
MANIFEST = "manifest.json"


def is_url(location: str) -> bool:
    return urlparse(location).scheme in ("http", "https")


def _copy_checked(src: Path, dest: Path, field: str, sha256: str | None) -> str:
    if not src.is_file():
        raise CorpusError(f"{field}: {src} does not exist (give the path of an existing file)")
    digest = sha256_file(src)
    if sha256 and digest != sha256.lower():
        raise DownloadError(f"{src}: sha256 mismatch: expected {sha256}, got {digest} (fix corpus.sha256)")
    shutil.copyfile(src, dest)
    return digest


def local_sha256(paths: list[Path]) -> str:
    """What `corpus.sha256` means for a local corpus: the sha256 of train, valid and test concatenated in that order
    (`cat train.txt valid.txt test.txt | sha256sum`)."""
    digest = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            while block := f.read(1 << 20):
                digest.update(block)
    return digest.hexdigest()


def check_text_file(path: Path, field: str) -> None:
    """A local corpus file must be non-empty UTF-8 text; say which file and what to do otherwise."""
    data = path.read_bytes()
    if not data.strip():
        raise CorpusError(f"{field}: {path} is empty (give a file with text in it)")
    if b"\x00" in data:
        raise CorpusError(f"{field}: {path} looks binary (NUL bytes); give a UTF-8 text file")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CorpusError(
            f"{field}: {path} is not valid UTF-8 (byte {exc.start}); re-encode it as UTF-8"
        ) from None


def _fetch_into(corpus: CorpusParams, out: Path, cache_dir: Path) -> dict:
    """Put the source's files into `out`; return {file name: origin, sha256}."""
    files = {}
    if corpus.source == "enwiki-sample":
        digest = _copy_checked(ENWIKI_SAMPLE, out / "enwiki-sample.xml.bz2", "corpus.source", corpus.sha256)
        origin = f"gensim=={gensim.__version__}:{ENWIKI_SAMPLE.relative_to(Path(gensim.__file__).parent.parent)}"
        files["enwiki-sample.xml.bz2"] = (origin, digest)
    elif corpus.source == "local":
        for split in SPLITS:
            src = Path(getattr(corpus.files, split)).expanduser()
            digest = _copy_checked(src, out / f"{split}.txt", f"corpus.files.{split}", None)
            check_text_file(src, f"corpus.files.{split}")
            files[f"{split}.txt"] = (getattr(corpus.files, split), digest)
        if corpus.sha256:
            together = local_sha256([out / f"{split}.txt" for split in SPLITS])
            if together != corpus.sha256.lower():
                raise DownloadError(f"corpus.files: sha256 of train+valid+test mismatch: expected {corpus.sha256}, "
                                    f"got {together} (fix corpus.sha256)")
    else:
        location = corpus.url or WIKITEXT_URLS[corpus.source]
        name = Path(urlparse(location).path).name or "dump"
        if is_url(location):
            digest = download(location, out / name, cache_dir=cache_dir, sha256=corpus.sha256)
        else:
            digest = _copy_checked(Path(location).expanduser(), out / name, "corpus.url", corpus.sha256)
        files[name] = (location, digest)
    return files


def fetch_corpus(corpus: CorpusParams, raw_dir: str | Path, cache_dir: str | Path) -> dict:
    """Fill `raw_dir` (replaced atomically) and write its manifest; return the manifest."""
    raw_dir = Path(raw_dir)
    with atomic_path(raw_dir) as tmp:
        tmp.mkdir()
        files = _fetch_into(corpus, tmp, Path(cache_dir))
        manifest = {
            "source": corpus.source,
            "files": {
                name: {"origin": origin, "sha256": digest, "bytes": (tmp / name).stat().st_size}
                for name, (origin, digest) in files.items()
            },
        }
        write_json(tmp / MANIFEST, manifest)
    return manifest


def corpus_sha256(raw_dir: str | Path) -> str | None:
    """The value of `corpus.sha256` that pins the corpus in `raw_dir`: its file's sha256, or a local corpus's three
    files concatenated (None when `raw_dir` holds no fetched corpus)."""
    raw_dir = Path(raw_dir)
    try:
        manifest = json.loads((raw_dir / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if manifest.get("source") == "local":
        return local_sha256([raw_dir / f"{split}.txt" for split in SPLITS])
    (only,) = manifest["files"].values()
    return only["sha256"]
