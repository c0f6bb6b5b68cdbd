"""Atomic file output, CSV text and hashing: a failed stage never leaves a half-written file behind."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def atomic_path(dest: str | os.PathLike, need: int | None = None) -> Iterator[Path]:
    """Yield a temporary path beside `dest` (file or directory); rename it onto `dest` only on success. A directory
    `dest` is replaced whole (a stage's output, which DVC owns), so the working directory and the folders above it
    are refused: replacing one would delete the project. `need`: about how many bytes the write takes, for the
    line a full disk gives."""
    dest = Path(dest)
    if holds_working_directory(dest):
        from lmpipe.errors import LmpipeError

        raise LmpipeError(f"{dest}: is the working directory or a folder above it, which lmpipe never replaces; "
                          "write to a new folder")
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    os.close(fd)
    os.unlink(tmp)
    tmp = Path(tmp)
    with replacing(tmp, dest, need):
        yield tmp
        if dest.is_dir() and not dest.is_symlink():
            shutil.rmtree(dest)
        os.replace(tmp, dest)


@contextlib.contextmanager
def replacing(tmp: Path, dest: Path, need: int | None = None) -> Iterator[None]:
    """Around a write into `tmp` that ends by renaming it onto `dest`: on any failure, Ctrl-C included, `tmp` goes
    (a partial file would only fill the disk further), and a full disk is one DiskFull line naming `dest`."""
    try:
        yield
    except BaseException as exc:
        written = _size(tmp)
        _remove(tmp)
        if isinstance(exc, (OSError, RuntimeError)) and (full := disk_full(exc, dest, need, written)):
            raise full from None
        raise


def _size(path: Path) -> int:
    try:
        if path.is_dir() and not path.is_symlink():
            return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        return path.stat().st_size
    except OSError:
        return 0


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


def payload_bytes(obj) -> int:
    """About how many bytes torch.save writes for `obj`: its arrays' bytes (tensors, numpy arrays) in nested dicts,
    lists and tuples; the rest is small."""
    if isinstance(obj, dict):
        return sum(payload_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(payload_bytes(v) for v in obj)
    size = getattr(obj, "nbytes", None)
    return size if isinstance(size, int) else 0


# What torch.save's C++ writer says when a write came up short (no errno, no path): a full disk, most often
TORCH_WRITE_FAILED = ("file write failed", "unexpected pos")


def disk_full(exc: BaseException, dest: Path | None = None, need: int | None = None, written: int = 0):
    """A DiskFull of one line when `exc` is a write that ran out of space: the path (`dest`, or the file the error
    names), about how much the write needs (`need`; else more than the `written` bytes it got), how much is free,
    and what to do. None for any other failure. torch.save reports a short write as a RuntimeError without an
    errno: it counts as a full disk only where too little is free for `need`."""
    from lmpipe.errors import DiskFull

    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        where = dest or exc.filename
    elif isinstance(exc, RuntimeError) and any(text in str(exc) for text in TORCH_WRITE_FAILED):
        where = dest
    else:
        return None
    free = free_bytes(Path(where)) if where else None
    if isinstance(exc, RuntimeError) and free is not None and free >= max((need or 0) * 1.25 + 2**20, 64 * 2**20):
        return None  # room enough: some other failure of torch's writer
    wanted = f"needs about {_mb(need)}" if need else f"needs more than {_mb(written)}" if written else ""
    room = f"{_mb(free)} free" if free is not None else ""
    detail = ", ".join(filter(None, [wanted, room]))
    return DiskFull(f"no space left on {where or 'a checkpoint or model file (torch.save)'}"
                    f"{': ' + detail if detail else ''} (free space, then rerun: it resumes)")


def free_bytes(path: Path) -> int | None:
    """Free bytes on the filesystem that holds `path` (or would: its nearest existing folder)."""
    for folder in [path, *path.absolute().parents]:
        if folder.exists():
            try:
                return shutil.disk_usage(folder).free
            except OSError:
                return None
    return None


def _mb(size: int | None) -> str:
    size = size or 0
    if size < 100_000:
        return f"{max(size, 1) / 1e3:.0f} kB" if size >= 1000 else f"{size} bytes"
    return f"{size / 1e6:.1f} MB" if size < 1e8 else f"{size / 1e6:,.0f} MB"


OUT_MARK = "lmpipe-output.json"  # written into every folder a user names with --out: which files there are lmpipe's


def check_out_dir(dest: str | os.PathLike, command: str) -> None:
    """A folder a user named for results (--out) is new, empty, or an earlier result of lmpipe's (it holds OUT_MARK):
    anything else is the user's, and is refused before any work is done."""
    from lmpipe.errors import LmpipeError

    dest = Path(dest)
    if dest.exists() and not dest.is_dir():
        raise LmpipeError(f"{command} --out {dest}: is a file; name a new or empty folder")
    if dest.is_dir() and any(dest.iterdir()) and not (dest / OUT_MARK).is_file():
        raise LmpipeError(f"{command} --out {dest}: the folder holds files that lmpipe did not write (and no "
                          f"{OUT_MARK}); name a new or empty folder")
    if holds_working_directory(dest):
        raise LmpipeError(f"{command} --out {dest}: is the working directory or a folder above it; name a new folder")


@contextlib.contextmanager
def out_dir(dest: str | os.PathLike, mark: dict) -> Iterator[Path]:
    """Yield an empty staging folder beside the user's --out folder `dest`; on success, move each file staged there
    into `dest` (each replaced atomically), remove the files an earlier --out listed in OUT_MARK and this one did not
    write, and write OUT_MARK (`mark` plus the file list) last. Nothing else in `dest` is touched: a file the user
    put there, before or during the run, stays; where one has a name lmpipe writes, lmpipe's goes beside it
    (`curve.lmpipe.csv`), and a line on stderr says so."""
    from lmpipe.errors import DiskFull

    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    staged = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent))
    try:
        try:
            yield staged
        except DiskFull as exc:  # named as the user knows it: the folder they chose, not the staging one
            raise DiskFull(str(exc).replace(str(staged), str(dest))) from None
        try:
            before = set(json.loads((dest / OUT_MARK).read_text()).get("files", []))
        except (OSError, ValueError, AttributeError):
            before = set()
        names = []
        for name in sorted(p.name for p in staged.iterdir()):
            theirs = (dest / name).exists() and name not in before  # the user's: it stays
            kept = f"{Path(name).stem}.lmpipe{Path(name).suffix}" if theirs else name
            if theirs:
                print(f"--out {dest}: {name} is not lmpipe's (it appeared during the run): kept as it is; this run's "
                      f"is {dest / kept}", file=sys.stderr)
            os.replace(staged / name, dest / kept)
            names.append(kept)
        for name in sorted(before - set(names)):
            if Path(name).name == name:  # a plain name of this folder, never a path elsewhere
                (dest / name).unlink(missing_ok=True)
        write_json(dest / OUT_MARK, {**mark, "files": names})
    finally:
        shutil.rmtree(staged, ignore_errors=True)


def holds_working_directory(path: Path) -> bool:
    """Whether `path` is the working directory or a folder above it: replacing it would delete the project."""
    here = Path.cwd().resolve()
    return path.resolve() == here or path.resolve() in here.parents


def write_text(dest: str | os.PathLike, text: str) -> None:
    data = text.encode("utf-8")
    with atomic_path(dest, need=len(data)) as tmp:
        tmp.write_bytes(data)


def write_json(dest: str | os.PathLike, obj) -> None:
    write_text(dest, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def sha256_tree(path: str | os.PathLike) -> str:
    """sha256 of a file, or of a directory's files (names and contents, in sorted order)."""
    path = Path(path)
    if path.is_file():
        return sha256_file(path)
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(f"{file.relative_to(path).as_posix()}\0{sha256_file(file)}\n".encode())
    return digest.hexdigest()


def csv_text(rows: list[dict], columns: list[str] | tuple[str, ...] | None = None, newline: str = "\r\n") -> str:
    """Rows as CSV text through pandas, the project's one CSV writer: rows of one shape under the first row's keys
    ('' when there are none; a key beyond them is refused), or the `columns` given (a header even without rows; other
    keys left out). Each cell is written as Python writes it (object columns: an int stays an int beside a None,
    which is written empty, and a float NaN as nan). Lines end in \r\n, as they always have, or with `newline` where
    a file has always had another ending (seeds/*.csv: \n)."""
    import numpy as np
    import pandas as pd  # here, not at the top: every lmpipe command imports this module

    if not rows and not columns:
        return ""
    names = list(columns or rows[0])
    if not columns and (extra := {k for row in rows for k in row} - set(names)):
        raise ValueError(f"csv_text: keys {sorted(extra)} are not in the first row's {names}")
    cells = [{k: "nan" if isinstance(v, (float, np.floating)) and v != v else v for k, v in row.items()}
             for row in rows]
    return pd.DataFrame(cells, columns=names, dtype=object).to_csv(index=False, lineterminator=newline)


def csv_records(path: str | os.PathLike) -> list[dict[str, str]]:
    """A CSV table's rows, each cell the text the file holds ('' for an empty one; the caller converts): the one
    CSV reader, pandas' beside its writer. No rows when the file is missing or empty."""
    import pandas as pd

    try:
        return pd.read_csv(path, dtype=str, keep_default_na=False, index_col=False).to_dict("records")
    except FileNotFoundError:
        return []
    except pd.errors.EmptyDataError:  # not even a header
        return []


# Numbers that differ from run to run of the same params and code: how long a step took, how fast, how much memory.
# They go to MLflow (each stage's run) and never into a git- or DVC-tracked file, so a reproduced study changes none.
TIMINGS = frozenset({"seconds", "train_seconds", "wall_seconds", "build_seconds", "tokens_per_sec", "flops_per_sec",
                     "mfu", "peak_rss_mb", "encode_tokens_per_sec", "valid_score_tokens_per_sec",
                     "test_score_tokens_per_sec"})


def without_timings(metrics: dict) -> dict:
    """`metrics` less its timings (TIMINGS): what a tracked metrics file or curve holds."""
    return {k: v for k, v in metrics.items() if k not in TIMINGS}
