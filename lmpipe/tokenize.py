"""Byte-level BPE (HF `tokenizers`) trained on the train split, and the token streams every model reads.

A stream is the split's lines, each followed by the boundary token (which stands for the newline),
so decode(encode(text)) == text byte for byte and models see paragraph and article boundaries.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from lmpipe.config import TokenizerParams
from lmpipe.errors import CorpusError
from lmpipe.io import atomic_path, write_json

SPLITS = ("train", "valid", "test")
COUNTS = "counts.json"  # data/tokens/counts.json: vocabulary, boundary, tokens/words/bytes per split


def split_lines(text: str) -> list[str]:
    """The lines of a text file; a final newline ends the last line rather than starting an empty one."""
    lines = text.split("\n")
    return lines[:-1] if text.endswith("\n") else lines


def train_tokenizer(text: str, params: TokenizerParams) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=params.vocab_size,
        min_frequency=params.min_frequency,
        special_tokens=[params.boundary_token],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(split_lines(text), trainer=trainer)
    return tokenizer


def boundary_id(tokenizer: Tokenizer, boundary_token: str) -> int:
    token_id = tokenizer.token_to_id(boundary_token)
    if token_id is None:
        raise CorpusError(f"tokenizer has no boundary token {boundary_token!r} (re-run the tokenize stage)")
    return token_id


def stream_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def encode_stream(tokenizer: Tokenizer, text: str, boundary: int) -> np.ndarray:
    """Token ids of every line, each line closed by the boundary token."""
    encodings = tokenizer.encode_batch_fast(split_lines(text), add_special_tokens=False)
    pieces = [np.append(np.asarray(e.ids, dtype=np.int64), boundary) for e in encodings]
    ids = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)
    return ids.astype(stream_dtype(tokenizer.get_vocab_size()))


def decode_stream(tokenizer: Tokenizer, ids: np.ndarray, boundary: int) -> str:
    """Inverse of `encode_stream`."""
    ids = np.asarray(ids, dtype=np.int64)
    cuts = np.flatnonzero(ids == boundary)
    segments = np.split(ids, cuts + 1)[:-1] if len(cuts) else [ids]
    lines = tokenizer.decode_batch([s[s != boundary].tolist() for s in segments], skip_special_tokens=False)
    return "".join(line + "\n" for line in lines) if len(cuts) else lines[0]


def tokenize_corpus(clean_dir: str | Path, tokens_dir: str | Path, params: TokenizerParams) -> dict:
    """Train on train.txt, encode every split to {split}.npy (directory replaced atomically); return metrics."""
    texts = {s: (Path(clean_dir) / f"{s}.txt").read_text(encoding="utf-8") for s in SPLITS}
    started = time.perf_counter()
    tokenizer = train_tokenizer(texts["train"], params)
    train_seconds = time.perf_counter() - started
    boundary = boundary_id(tokenizer, params.boundary_token)
    streams, encode_seconds = {}, 0.0
    for split, text in texts.items():
        started = time.perf_counter()
        streams[split] = encode_stream(tokenizer, text, boundary)
        encode_seconds += time.perf_counter() - started
    counts = {
        "vocab_size": tokenizer.get_vocab_size(),
        "boundary_token": params.boundary_token,
        "boundary_id": boundary,
        "dtype": str(streams["train"].dtype),
        "tokens": {s: int(len(ids)) for s, ids in streams.items()},
        "words": {s: len(t.split()) for s, t in texts.items()},
        "bytes": {s: len(t.encode("utf-8")) for s, t in texts.items()},
    }
    with atomic_path(tokens_dir) as tmp:
        tmp.mkdir()
        tokenizer.save(str(tmp / "tokenizer.json"))
        for split, ids in streams.items():
            np.save(tmp / f"{split}.npy", ids)
        # what the streams mean, without timings: a re-run giving the same tokens changes no downstream input
        write_json(tmp / COUNTS, counts)
    return {
        **counts,
        "train_seconds": round(train_seconds, 3),
        "encode_tokens_per_sec": round(sum(map(len, streams.values())) / max(encode_seconds, 1e-9), 1),
    }
