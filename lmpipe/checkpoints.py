"""A training run's resumable checkpoints: what they hold, where they live, and when they go.

A run's folder is `<root>/<model>-<key>` (12 hex digits; `-x<N>` under N processes), keyed by everything that
determines the run, so only the very same run resumes. Checkpoints outlive the training loop: the entry point
discards them only after every output (model, metrics, curve, MLflow run) is written, so a failure after the last
optimizer step never costs the training. Pruning deletes only folders that lmpipe marked as its own when it made
them (`MARK`, naming the model): a user's folder beside them survives whatever its name.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

from lmpipe.codebase import code_hash
from lmpipe.io import payload_bytes, replacing

KEEP = 3  # unfinished runs kept per model; older ones (abandoned configurations) are deleted
MARK = "lmpipe-checkpoints.json"  # written into every run folder lmpipe makes: what pruning may delete


@lru_cache(maxsize=1)
def code_version() -> str:
    """A hash of the training code: every project file that `lmpipe.train.job` imports, directly or not, less the
    plumbing (lmpipe.codebase, the same walk that checks the DVC deps). Changed code never resumes an old run, and
    the seeds' and the grid's cached rows of the old code are not reused."""
    return code_hash()


def run_key(chosen: dict, fingerprint: str, **extra) -> str:
    """What decides a run, hashed: its params (`chosen`), the training code and the token data's fingerprint, and
    whatever else a caller's result depends on (`extra`). The one key of checkpoint folders and cached rows."""
    from lmpipe.config import params_hash

    return params_hash({**chosen, "code": code_version(), "data": fingerprint, **extra})


def checkpoint_dir(root: str | Path, model: str, chosen: dict, fingerprint: str, world: int = 1) -> Path:
    """The run's folder, keyed by `run_key` and the process count."""
    return Path(root) / (f"{model}-{run_key(chosen, fingerprint)}" + ("" if world == 1 else f"-x{world}"))


def make_dir(ckpt_dir: str | Path, model: str) -> Path:
    """Create the run folder, marked as lmpipe's (the model's name in `MARK`), so pruning can tell it from a user's."""
    ckpt_dir = Path(ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    if not (ckpt_dir / MARK).exists():
        (ckpt_dir / MARK).write_text(json.dumps({"written_by": "lmpipe", "model": model}))
    return ckpt_dir


def _marked_for(folder: Path) -> str | None:
    """The model a run folder lmpipe made belongs to; None for any folder it did not make."""
    try:
        return json.loads((folder / MARK).read_text()).get("model")
    except (OSError, ValueError, AttributeError):
        return None


def prune(keep_dir: str | Path, model: str, keep: int = KEEP) -> list[Path]:
    """Delete all but the newest `keep` run folders of `model` beside `keep_dir` (`keep_dir` itself always stays).
    Only folders that lmpipe marked as runs of this model count: nothing else in the root, and nothing outside it."""
    keep_dir = Path(keep_dir)
    if not keep_dir.parent.is_dir():
        return []
    others = [d for d in keep_dir.parent.iterdir()
              if d.is_dir() and not d.is_symlink() and d != keep_dir and _marked_for(d) == model]
    gone = sorted(others, key=lambda d: d.stat().st_mtime, reverse=True)[keep - 1:]
    for old in gone:
        shutil.rmtree(old, ignore_errors=True)
    return gone


def discard(ckpt_dir: str | Path) -> None:
    """A finished run's checkpoints, once its outputs are safe: the next run of it trains from scratch."""
    shutil.rmtree(ckpt_dir, ignore_errors=True)


def save(state: dict, path: Path) -> None:
    """`state` replaces the file at `path` whole: a kill or a full disk mid-save leaves the previous file, and no
    partial one (a full disk: one line naming `path`, with the space it needs)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")  # one name per file: a temp file a kill -9 left is overwritten by the next save
    with replacing(tmp, path, need=payload_bytes(state)):
        torch.save(state, tmp)
        os.replace(tmp, path)


@dataclass
class Checkpoint:
    """All a resumed run needs to end bit for bit as an uninterrupted one; a plain dict on disk."""

    model: dict
    optimizer: dict
    progress: dict  # the trainer's progress record (lmpipe.train._Progress), as plain fields
    torch_rng: torch.Tensor
    cuda_rng: list | None
    hidden: object  # the recurrent state carried into the next chunk

    def save(self, path: Path) -> None:
        save(vars(self), path)

    @classmethod
    def load(cls, path: Path, device: torch.device) -> Checkpoint:
        """Tensors and plain values only (`weights_only=True`): a checkpoint file cannot run code."""
        return cls(**torch.load(path, map_location=device, weights_only=True))


def last_path(ckpt_dir: str | Path, rank: int) -> Path:
    """The resumable checkpoint: one per process (each has its own RNG and hidden state)."""
    return Path(ckpt_dir) / ("last.pt" if rank == 0 else f"last.rank{rank}.pt")


def best_path(ckpt_dir: str | Path) -> Path:
    """The best weights so far (by valid loss), written by the main process: what a finished run loads."""
    return Path(ckpt_dir) / "best.pt"
