"""The one downloader: streaming, timeout, retries with backoff, HTTP Range resume, checksum, atomic rename."""

from __future__ import annotations

import hashlib
import shutil
import time
from pathlib import Path
from urllib.parse import urlparse

import requests
from tqdm.auto import tqdm

from lmpipe.errors import DownloadError
from lmpipe.io import atomic_path, sha256_file

TRANSIENT = (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError)


class _Incomplete(Exception):
    """The server closed the body early; resume from what we have."""


def partial_path(url: str, cache_dir: Path) -> Path:
    """Where the unfinished bytes of `url` live between attempts (outside DVC outputs, so they survive)."""
    name = Path(urlparse(url).path).name or "download"
    return Path(cache_dir) / f"{hashlib.sha256(url.encode()).hexdigest()[:12]}-{name}.part"


def _fetch_once(url: str, part: Path, timeout: float, progress: bool) -> None:
    offset = part.stat().st_size if part.exists() else 0
    headers = {"Range": f"bytes={offset}-"} if offset else {}
    with requests.get(url, stream=True, timeout=timeout, headers=headers) as response:
        if response.status_code == 416 and offset:  # nothing left to send: the part file is whole
            return
        if 400 <= response.status_code < 500:
            raise DownloadError(
                f"{url}: HTTP {response.status_code} {response.reason} (check corpus.url / the source's URL)"
            )
        response.raise_for_status()
        if offset and response.status_code != 206:  # server ignored Range: start over
            offset = 0
        length = response.headers.get("Content-Length")
        total = offset + int(length) if length is not None else None
        with open(part, "ab" if offset else "wb") as out, tqdm(
            total=total, initial=offset, unit="B", unit_scale=True, desc=part.name, disable=not progress
        ) as bar:
            for chunk in response.iter_content(chunk_size=1 << 16):
                out.write(chunk)
                bar.update(len(chunk))
    if total is not None and part.stat().st_size < total:
        raise _Incomplete(f"got {part.stat().st_size} of {total} bytes")


def download(
    url: str,
    dest: str | Path,
    *,
    cache_dir: str | Path,
    sha256: str | None = None,
    timeout: float = 30.0,
    retries: int = 5,
    backoff: float = 1.0,
    progress: bool = True,
) -> str:
    """Download `url` to `dest` and return its sha256; resume a partial file left by an earlier attempt.

    A checksum mismatch deletes the partial file and leaves nothing at `dest`.
    """
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    part = partial_path(url, cache_dir)
    for attempt in range(retries + 1):
        try:
            _fetch_once(url, part, timeout, progress)
            break
        except (*TRANSIENT, _Incomplete, requests.HTTPError) as exc:
            if attempt == retries:
                raise DownloadError(
                    f"{url}: failed after {retries + 1} attempts ({exc.__class__.__name__}: {exc}); "
                    "check the network and re-run: the download resumes where it stopped"
                ) from None
            time.sleep(backoff * 2**attempt)
    digest = sha256_file(part)
    if sha256 and digest != sha256.lower():
        part.unlink()
        raise DownloadError(
            f"{url}: sha256 mismatch: expected {sha256}, got {digest} (fix corpus.sha256, or remove it to record the hash)"
        )
    with atomic_path(dest) as tmp:
        shutil.move(part, tmp)
    return digest
