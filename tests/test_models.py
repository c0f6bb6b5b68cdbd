"""Neural LMs: each learns, respects causality and its context size, and the AWD parts do what they claim."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lmpipe.evaluate import stream_nll
from lmpipe.models import NPLM, RNNModel, TransformerLM, build_model, count_parameters
from lmpipe.models.rnn import LockedDropout, WeightDrop

V = 40
ALL = {
    "nplm": ("nplm", {"context": 4, "emb": 32, "hidden": 64}),
    "rnn": ("rnn", {"cell": "rnn_tanh", "emb": 32, "layers": 1}),
    "lstm": ("rnn", {"cell": "lstm", "emb": 32, "hidden": 64, "layers": 2, "weight_drop": 0.2, "dropout": 0.1,
                     "dropout_input": 0.1, "dropout_hidden": 0.1, "dropout_embedding": 0.05, "ar": 1.0, "tar": 1.0}),
    "gru": ("rnn", {"cell": "gru", "emb": 32, "layers": 2, "hidden": 48}),
    "transformer": ("transformer", {"dim": 32, "layers": 2, "heads": 4, "block_size": 32, "dropout": 0.0}),
}


@pytest.mark.parametrize("name", list(ALL))
def test_every_model_overfits_one_batch(name):
    torch.manual_seed(0)
    family, arch = ALL[name]
    model = build_model(family, arch, V, boundary=0)
    x = torch.randint(1, V, (4, 17))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(300):
        logits, _, aux = model(x[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten()) + aux
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    logits, _, _ = model(x[:, :-1])
    final = F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten()).item()
    limit = 1.5 if name == "nplm" else 0.2  # NPLM sees 4 tokens: some random continuations stay ambiguous
    assert final < limit, final


def test_transformer_is_causal():
    torch.manual_seed(0)
    model = TransformerLM(V, dim=32, layers=2, heads=4, block_size=32, dropout=0.0).eval()
    x = torch.randint(0, V, (2, 20))
    base, _, _ = model(x)
    for t in (0, 7, 18):
        changed = x.clone()
        changed[:, t + 1:] = torch.randint(0, V, changed[:, t + 1:].shape)
        logits, _, _ = model(changed)
        assert torch.equal(logits[:, : t + 1], base[:, : t + 1])
        assert not torch.allclose(logits[:, t + 1:], base[:, t + 1:])


def test_attention_on_a_cpu_runs_in_fp32_under_bf16_autocast():
    """Training steps run in bf16 autocast where the CPU has it; the attention inside them is computed in fp32 (its
    bf16 CPU kernel is the slower and the less exact), so it equals fp32 attention of the same inputs."""
    from lmpipe.models.transformer import attend

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 16, 8).bfloat16() for _ in range(3))
    exact = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True).bfloat16()
    bf16 = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = attend(q, k, v, causal=True)
        under_autocast = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    assert out.dtype == torch.bfloat16 and torch.equal(out, exact)
    assert under_autocast.dtype == torch.bfloat16 and not torch.equal(bf16.float(), exact.float())


def test_the_transformers_dropout_keeps_each_value_with_probability_1_minus_p_and_rescales_it():
    """Its CPU masks come from torch.rand, not bernoulli_: the same dropout, drawn from the seeded generator."""
    from lmpipe.models.transformer import Dropout

    drop, x = Dropout(0.2), torch.ones(64, 128, 128, dtype=torch.bfloat16)
    torch.manual_seed(0)
    out = drop(x)
    assert set(out.unique().tolist()) == {0.0, 1.25}
    assert abs((out == 0).float().mean().item() - 0.2) < 0.005
    torch.manual_seed(0)
    assert torch.equal(out != 0, torch.rand(x.shape) >= 0.2)  # the mask torch.rand draws, not bernoulli_'s
    torch.manual_seed(0)
    assert torch.equal(drop(x), out)
    assert torch.equal(drop.eval()(x), x)


def test_nplm_reads_exactly_its_context():
    torch.manual_seed(0)
    model = NPLM(V, context=3, emb=8, hidden=16).eval()
    x = torch.randint(1, V, (1, 12))
    base, _, _ = model(x)
    t = 8
    older = x.clone()
    older[0, : t - 2] = 0  # tokens before the 3-token window ending at t
    same, _, _ = model(older)
    assert torch.equal(same[0, t], base[0, t])
    inside = x.clone()
    inside[0, t - 2] = (x[0, t - 2] + 1) % V  # the oldest token of the window
    moved, _, _ = model(inside)
    assert not torch.allclose(moved[0, t], base[0, t])


def test_weight_tying_shares_one_tensor():
    lstm = RNNModel(V, cell="lstm", emb=16, hidden=32, layers=2, tie=True)
    assert lstm.decoder.weight is lstm.embed.weight
    transformer = TransformerLM(V, dim=16, layers=1, heads=2, block_size=8)
    assert transformer.head.weight is transformer.embed.weight
    untied = RNNModel(V, cell="lstm", emb=16, hidden=32, layers=2, tie=False)
    assert count_parameters(untied) - count_parameters(lstm) > V * 16 - 32 * 16 - 1  # the decoder adds its own


def test_weight_drop_changes_w_hh_only_in_training():
    torch.manual_seed(0)
    layer = WeightDrop(torch.nn.LSTM(8, 8, batch_first=True), p=0.5)
    x = torch.randn(2, 5, 8)
    before = layer.rnn.weight_hh_l0.detach().clone()
    layer.eval()
    assert torch.equal(layer(x, None)[0], layer.rnn(x, None)[0])  # eval: the plain LSTM
    layer.train()
    dropped = layer(x, None)[0]
    assert not torch.allclose(dropped, layer.rnn(x, None)[0])
    # only W_hh is dropped: with a zero initial state the first step never touches W_hh
    assert torch.allclose(dropped[:, 0], layer.rnn(x, None)[0][:, 0])
    assert torch.equal(layer.rnn.weight_hh_l0, before)  # the parameter itself is never overwritten


def test_locked_dropout_uses_one_mask_across_time():
    torch.manual_seed(0)
    drop = LockedDropout().train()
    out = drop(torch.ones(3, 50, 16), 0.5)
    zero = out == 0
    assert torch.equal(zero, zero[:, :1].expand_as(zero))  # the same units dropped at every step
    assert 0.2 < zero[:, 0].float().mean() < 0.8
    assert torch.equal(drop.eval()(torch.ones(3, 5, 4), 0.5), torch.ones(3, 5, 4))


@pytest.mark.parametrize("name", ["lstm", "gru", "rnn", "nplm", "transformer"])
def test_carried_state_equals_one_long_pass(name):
    torch.manual_seed(0)
    family, arch = ALL[name]
    model = build_model(family, arch, V, boundary=0).eval()
    x = torch.randint(0, V, (2, 30))
    whole, _, _ = model(x)
    state, pieces = None, []
    for start in range(0, 30, 7):
        logits, state, _ = model(x[:, start:start + 7], state)
        pieces.append(logits)
        state = model.detach_state(state)
    # (the transformer's window of 32 covers all 30 tokens, so its sliding window is exact here too)
    torch.testing.assert_close(torch.cat(pieces, dim=1), whole, atol=1e-5, rtol=1e-5)


def test_stream_evaluation_matches_one_forward_pass():
    torch.manual_seed(0)
    model = RNNModel(V, cell="lstm", emb=16, hidden=32, layers=2).eval()
    tokens = np.random.default_rng(0).integers(1, V, 200)
    nll, n = stream_nll(model, tokens, chunk=17)
    stream = torch.tensor(np.concatenate([[0], tokens]))[None]
    logits, _, _ = model(stream[:, :-1])
    expected = F.cross_entropy(logits[0], stream[0, 1:], reduction="sum").item()
    assert n == 200 and nll == pytest.approx(expected, rel=1e-5)


def test_next_token_distribution_is_a_distribution():
    model = build_model(*ALL["gru"], V, boundary=0)
    p = model.next_token_distribution([3, 4, 5])
    assert p.shape == (V,) and abs(p.sum() - 1) < 1e-6 and model.training  # mode restored


@pytest.mark.parametrize("name", ["lstm", "transformer", "nplm"])
def test_batched_next_token_distributions_match_single(name):
    model = build_model(*ALL[name], V, boundary=0)
    contexts = [[3, 4, 5], [7, 1, 2], [9, 9, 9]]
    batched = model.next_token_distributions(contexts)
    for row, context in zip(batched, contexts):
        np.testing.assert_allclose(row, model.next_token_distribution(context), atol=1e-6)


def test_a_model_takes_its_family_settings_defaults_and_checks_from_lmpipe_families():
    """A family's arch defaults are written once (lmpipe.families): the model built from a partial arch is the
    model built from the whole one, and a setting the family's schema refuses is refused by the constructor too."""
    from pydantic import ValidationError

    from lmpipe.model_params import arch_settings
    from lmpipe.families import FAMILIES as SETTINGS

    for family, schema in SETTINGS.items():
        torch.manual_seed(0)
        partial = build_model(family, {}, V, boundary=0)
        torch.manual_seed(0)
        whole = build_model(family, arch_settings(family, {}).model_dump(), V, boundary=0)
        assert all(torch.equal(a, b) for a, b in zip(partial.state_dict().values(), whole.state_dict().values()))
        assert partial.recurrent == schema.recurrent, family
    assert build_model("rnn", {"cell": "gru", "layers": 1}, V, 0).rnns[0].rnn.__class__.__name__ == "GRU"
    with pytest.raises(ValidationError, match="cell"):
        build_model("rnn", {"cell": "lstn"}, V, 0)
    with pytest.raises(ValidationError, match="divisible by heads"):
        build_model("transformer", {"dim": 30, "heads": 4}, V, 0)


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os

        return os.system, (f"touch {self.marker}",)


def test_a_model_file_that_would_run_code_is_refused_in_one_line_and_never_runs(tmp_path):
    from lmpipe.errors import ModelFileError
    from lmpipe.models import load_model

    marker = tmp_path / "ran"
    torch.save({"family": "rnn", "arch": {}, "vocab_size": 10, "boundary": 0, "state_dict": _Payload(marker)},
               tmp_path / "model.pt")
    with pytest.raises(ModelFileError) as info:
        load_model(tmp_path / "model.pt")
    assert str(tmp_path / "model.pt") in str(info.value) and "\n" not in str(info.value)
    assert "not an lmpipe model" in str(info.value) and "weights_only" not in str(info.value)  # lmpipe's advice only
    assert not marker.exists()


def test_a_long_library_message_is_cut_whole_at_a_word():
    from lmpipe.errors import first_line

    text = "word " * 100 + "\nsecond line"
    cut = first_line(text)
    assert len(cut) <= 304 and cut.endswith("word ...") and "second" not in cut
    assert first_line("short one\nmore") == "short one"


def test_a_saved_model_loads_back_with_weights_only(tmp_path):
    from lmpipe.models import load_model, save_model

    model = build_model("rnn", {"cell": "gru", "emb": 8, "layers": 1}, 20, 0)
    save_model(model, "rnn", {"cell": "gru", "emb": 8, "layers": 1}, tmp_path / "model.pt")
    loaded = load_model(tmp_path / "model.pt")
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values()))
