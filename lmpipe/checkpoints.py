"""A training run's resumable checkpoints: what they hold, where they live, and when they go.

A run's folder is `<root>/<model>-<key>` (12 hex digits; `-x<N>` under N processes), keyed by everything that
determines the run, so only the very same run resumes. Checkpoints outlive the training loop: the entry point
discards them only after every output (model, metrics, curve, MLflow run) is written, so a failure after the last
optimizer step never costs the training. Pruning touches only folders inside `root` that match the key pattern.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

KEEP = 3  # unfinished runs kept per model; older ones (abandoned configurations) are deleted
_KEY = r"[0-9a-f]{12}(-x[0-9]+)?"


def code_version() -> str:
    """A hash of the training code (the loop, the optimisers, FLOP counting, distribution and the models): changed
    code never resumes an old run."""
    here = Path(__file__).parent
    code = [here / name for name in ("train/trainer.py", "optim.py", "distributed.py", "flops.py")]
    digest = hashlib.sha256()
    for path in [*code, *sorted((here / "models").glob("*.py"))]:
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
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")  # replaced whole, so a kill mid-save leaves the previous checkpoint
        torch.save(vars(self), tmp)
        os.replace(tmp, path)

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
