"""Reading the tokenize stage's outputs: token streams plus the words and bytes each split holds."""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lmpipe import paths
from lmpipe.errors import CorpusError


@dataclass(frozen=True)
class Split:
    name: str
    tokens: np.ndarray
    words: int
    bytes: int


@dataclass(frozen=True)
class TokenData:
    vocab_size: int
    boundary: int
    splits: dict[str, Split]

    @functools.cached_property
    def fingerprint(self) -> str:
        """A hash of the token streams and what they count: keys checkpoints to the data they were trained on."""
        digest = hashlib.sha256(json.dumps([self.vocab_size, self.boundary]).encode())
        for name, split in sorted(self.splits.items()):
            digest.update(json.dumps([name, split.words, split.bytes, str(split.tokens.dtype)]).encode())
            digest.update(np.ascontiguousarray(split.tokens).tobytes())
        return digest.hexdigest()[:16]


def load_tokens(tokens_dir: str | Path = paths.TOKENS) -> TokenData:
    """The streams of data/tokens with the word and byte counts perplexities are normalised by."""
    counts = Path(tokens_dir) / "counts.json"
    if not counts.exists():
        raise CorpusError(f"{counts}: missing (run the tokenize stage first: dvc repro tokenize)")
    info = json.loads(counts.read_text())
    splits = {name: Split(name, _stream(Path(tokens_dir) / f"{name}.npy"), info["words"][name], info["bytes"][name])
              for name in ("train", "valid", "test")}
    return TokenData(info["vocab_size"], info["boundary_id"], splits)


def _stream(path: Path) -> np.ndarray:
    try:
        return np.load(path)
    except (OSError, ValueError, EOFError) as exc:  # missing, truncated or not a .npy file
        raise CorpusError(f"{path}: not a readable token stream ({str(exc).splitlines()[0]}); "
                          f"re-create it with: dvc repro --force tokenize") from None
