"""Byte-level BPE: exact round trip, one boundary per line, deterministic training, compact dtype."""

from __future__ import annotations

import numpy as np

from lmpipe.config import TokenizerParams
from lmpipe.tokenize import decode_stream, encode_stream, split_lines, stream_dtype, tokenize_corpus, train_tokenizer
from tests.helpers import section

TRICKY = " = Café = \nnaïve  double  spaces, tabs\tand emoji 🙂 — ünïcödé\n\n   leading spaces\n\n"


def test_round_trip_is_exact_for_any_utf8(sample_articles):
    from lmpipe.corpus.articles import format_articles

    train = format_articles(sample_articles)
    tokenizer = train_tokenizer(train, TokenizerParams(**section("tokenizer", vocab_size=600)))
    ids = encode_stream(tokenizer, TRICKY, 0)
    assert decode_stream(tokenizer, ids, 0) == TRICKY
    assert int((ids == 0).sum()) == len(split_lines(TRICKY)) == 5
    assert ids.dtype == np.uint16


def test_split_lines_and_dtype():
    assert split_lines("a\nb\n") == ["a", "b"]
    assert split_lines("a\n\nb") == ["a", "", "b"]
    assert stream_dtype(65536) == np.uint16 and stream_dtype(65537) == np.uint32


def test_tokenize_corpus_writes_streams_and_contract_metrics(tmp_path, sample_articles):
    from lmpipe.corpus.articles import format_articles

    clean = tmp_path / "clean"
    clean.mkdir()
    for i, split in enumerate(("train", "valid", "test")):
        (clean / f"{split}.txt").write_text(format_articles(sample_articles[i::3]))
    params = TokenizerParams(**section("tokenizer", vocab_size=1000, min_frequency=2))
    metrics = tokenize_corpus(clean, tmp_path / "tokens", params)
    assert metrics["vocab_size"] == 1000
    for split in ("train", "valid", "test"):
        ids = np.load(tmp_path / "tokens" / f"{split}.npy")
        text = (clean / f"{split}.txt").read_text()
        assert metrics["tokens"][split] == len(ids)
        assert metrics["words"][split] == len(text.split())
        assert metrics["bytes"][split] == len(text.encode())
        assert ids.max() < 1000
    again = tokenize_corpus(clean, tmp_path / "tokens2", params)
    assert (tmp_path / "tokens" / "tokenizer.json").read_bytes() == (tmp_path / "tokens2" / "tokenizer.json").read_bytes()
    assert again["tokens"] == metrics["tokens"]
    # BPE compresses: fewer tokens than bytes
    assert metrics["tokens"]["train"] < 0.5 * metrics["bytes"]["train"]
