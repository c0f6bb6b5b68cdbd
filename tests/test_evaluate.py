"""Perplexity accounting on models whose probabilities are known exactly."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lmpipe.evaluate import evaluate_lm, stream_nll
from lmpipe.models.base import StreamLM
from lmpipe.perplexity import perplexities
from lmpipe.splits import Split, TokenData


class TableLM(StreamLM):
    """P(next | current token) from a fixed table, as a stream model (its state: nothing)."""

    def __init__(self, table):
        super().__init__()
        self.log_table = torch.log(torch.tensor(table, dtype=torch.float64))
        self.dummy = torch.nn.Parameter(torch.zeros(1))

    def forward(self, x, state=None):
        return self.log_table[x].float(), None, 0.0


def test_uniform_model_has_perplexity_v():
    v = 17
    model = TableLM(np.full((v, v), 1 / v))
    tokens = np.random.default_rng(0).integers(0, v, 500)
    nll, n = stream_nll(model, tokens, chunk=33)
    assert n == 500
    assert perplexities(nll, n, 100, 1000)["ppl"] == pytest.approx(v, rel=1e-6)


def test_hand_built_bigram():
    # boundary 0; P(1|0)=0.5, P(2|1)=0.25, P(0|2)=1.0: the stream "1 2 0" costs 0.5 * 0.25 * 1.0
    table = np.full((3, 3), 1e-12)
    table[0] = [0.25, 0.5, 0.25]
    table[1] = [0.5, 0.25, 0.25]
    table[2] = [1.0, 1e-12, 1e-12]
    table /= table.sum(1, keepdims=True)
    model = TableLM(table)
    nll, n = stream_nll(model, np.array([1, 2, 0]), chunk=2)
    assert nll == pytest.approx(-math.log(0.5 * 0.25 * 1.0), rel=1e-5)
    result = perplexities(nll, n, words=2, n_bytes=4)
    assert result["ppl"] == pytest.approx((1 / (0.5 * 0.25)) ** (1 / 3), rel=1e-5)
    assert result["word_ppl"] == pytest.approx((1 / (0.5 * 0.25)) ** (1 / 2), rel=1e-5)  # 2 words
    assert result["bpb"] == pytest.approx(math.log2(8) / 4, rel=1e-5)  # 3 bits over 4 bytes


def test_ngram_and_neural_use_the_same_accounting():
    from lmpipe.ngram import NGramLM

    v = 6
    tokens = np.random.default_rng(1).integers(0, v, 300)
    data = TokenData(v, 0, {s: Split(s, tokens, 120, 900) for s in ("train", "valid", "test")})
    ngram = NGramLM(1, v, 0, "add_k", k=1e9).fit(tokens)  # a huge pseudo-count makes it uniform
    neural = TableLM(np.full((v, v), 1 / v))
    for result in (evaluate_lm(ngram, data), evaluate_lm(neural, data)):
        assert result["test"]["ppl"] == pytest.approx(v, rel=1e-6)
        assert result["test"]["word_ppl"] == pytest.approx(v ** (300 / 120), rel=1e-5)


class WindowProbe(StreamLM):
    """A window model (as the Transformer: carries its last tokens, reads at most block_size) that records how
    many earlier tokens each scored chunk could attend to."""

    block_size = 8

    def __init__(self, v):
        super().__init__()
        self.v, self.contexts = v, []
        self.dummy = torch.nn.Parameter(torch.zeros(1))

    def forward(self, x, state=None):
        full = x if state is None else torch.cat([state, x], dim=1)[:, -self.block_size:]
        self.contexts.append(full.size(1) - x.size(1))
        return torch.zeros(x.size(0), x.size(1), self.v), full[:, -(self.block_size - 1):], 0.0


def test_window_models_score_every_token_with_at_least_half_a_block_of_context():
    model = WindowProbe(5)
    nll, n = stream_nll(model, np.random.default_rng(0).integers(0, 5, 100), chunk=128)
    assert n == 100 and nll == pytest.approx(100 * math.log(5))  # every token once
    assert model.contexts[0] == 0  # the stream's start has nothing before it
    assert min(model.contexts[1:]) >= model.block_size // 2, model.contexts  # a stride of a whole block gives 0


def test_the_saved_per_token_log_probabilities_add_up_to_the_same_scores():
    """What `combine` mixes is what `evaluate` scored: same tokens, same accounting, and asking for them changes
    no number."""
    from lmpipe.ngram import NGramLM

    v, rng = 7, np.random.default_rng(4)
    tokens = rng.integers(0, v, 400)
    data = TokenData(v, 0, {s: Split(s, tokens, 150, 1000) for s in ("train", "valid", "test")})
    table = rng.dirichlet(np.ones(v), size=v)
    for model in (TableLM(table), NGramLM(2, v, 0, "kneser_ney").fit(tokens)):
        kept = {}
        if isinstance(model, TableLM):
            neural = kept
        result = evaluate_lm(model, data, chunk=33, token_logprobs=kept)
        assert result == evaluate_lm(model, data, chunk=33)
        for split in ("valid", "test"):
            assert kept[split].dtype == np.float32 and kept[split].shape == (400,)
            total = -float(kept[split].astype(np.float64).sum())
            assert perplexities(total, 400, 150, 1000)["bpb"] == pytest.approx(result[split]["bpb"], rel=1e-6)
    # token by token: the first is conditioned on the boundary (0), each next one on the token before it
    expected = np.log(table[np.concatenate([[0], tokens[:-1]]), tokens])
    np.testing.assert_allclose(neural["test"], expected, rtol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (benchmarks/gpu_check.sh runs it)")
def test_a_model_on_the_gpu_is_scored_there_as_on_the_cpu():
    """A GPU-trained model (python -m lmpipe.train --score, lmpipe seeds) is scored on its own device, to the same
    numbers as on the CPU."""
    from lmpipe.models import build_model

    torch.manual_seed(0)
    model = build_model("rnn", {"cell": "lstm", "emb": 16, "hidden": 16, "layers": 1}, 11, 0)
    tokens = np.random.default_rng(0).integers(0, 11, 300)
    data = TokenData(11, 0, {s: Split(s, tokens, 60, 900) for s in ("train", "valid", "test")})
    on_cpu = evaluate_lm(model, data, chunk=32)
    on_gpu = evaluate_lm(model.to("cuda"), data, chunk=32)
    assert on_gpu["test"]["bpb"] == pytest.approx(on_cpu["test"]["bpb"], rel=1e-4)
