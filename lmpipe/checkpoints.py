"""Where a training run's resumable checkpoints live, and when they go.

A run's folder is `<root>/<model>-<key>` (12 hex digits; `-x<N>` under N processes), keyed by everything that
determines the run, so only the very same run resumes. Checkpoints outlive the training loop: the entry point
discards them only after every output (model, metrics, curve, MLflow run) is written, so a failure after the last
optimizer step never costs the training. Pruning touches only folders inside `root` that match the key pattern.
"""

from __future__ import annotations

import hashlib
import re
import shutil
from pathlib import Path

KEEP = 3  # unfinished runs kept per model; older ones (abandoned configurations) are deleted
_KEY = r"[0-9a-f]{12}(-x[0-9]+)?"


def code_version() -> str:
    """A hash of the training code (the loop, FLOP counting, distribution and the models): changed code never
    resumes an old run."""
    here = Path(__file__).parent
    digest = hashlib.sha256()
    for path in [here / "train.py", here / "distributed.py", here / "flops.py", *sorted((here / "models").glob("*.py"))]:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def checkpoint_dir(root: str | Path, model: str, chosen: dict, fingerprint: str, world: int = 1) -> Path:
    """The run's folder, keyed by its params (`chosen`), the training code, the token data's fingerprint and the
    process count."""
    from lmpipe.config import params_hash

    key = params_hash({**chosen, "code": code_version(), "data": fingerprint})
    return Path(root) / (f"{model}-{key}" + ("" if world == 1 else f"-x{world}"))


def prune(keep_dir: str | Path, keep: int = KEEP) -> list[Path]:
    """Delete all but the newest `keep` run folders of `keep_dir`'s model (`keep_dir` itself always stays).
    Only siblings named exactly `<model>-<key>` count: nothing else in the root, and nothing outside it."""
    keep_dir = Path(keep_dir)
    match = re.fullmatch(rf"(.+)-{_KEY}", keep_dir.name)
    if match is None or not keep_dir.parent.is_dir():
        return []
    mine = re.compile(rf"{re.escape(match.group(1))}-{_KEY}")
    others = [d for d in keep_dir.parent.iterdir()
              if d.is_dir() and not d.is_symlink() and d != keep_dir and mine.fullmatch(d.name)]
    gone = sorted(others, key=lambda d: d.stat().st_mtime, reverse=True)[keep - 1:]
    for old in gone:
        shutil.rmtree(old, ignore_errors=True)
    return gone


def discard(ckpt_dir: str | Path) -> None:
    """A finished run's checkpoints, once its outputs are safe: the next run of it trains from scratch."""
    shutil.rmtree(ckpt_dir, ignore_errors=True)
