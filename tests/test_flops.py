"""The analytic FLOP count of each family agrees with torch's own count of one training step."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from lmpipe.flops import train_flops_per_token
from lmpipe.models import arch_with_defaults, build_model, count_non_embedding_parameters

V, B, T = 50, 3, 16

CASES = [
    ("nplm", {"context": 4, "emb": 8, "hidden": 24}),
    ("nplm", {"context": 3, "emb": 8, "hidden": 16, "direct": True}),
    ("transformer", {"dim": 32, "layers": 2, "heads": 4, "block_size": T, "dropout": 0.0}),
    ("transformer", {"dim": 24, "layers": 2, "heads": 2, "block_size": T, "dropout": 0.0, "position": "rope",
                     "norm": "rmsnorm", "qk_norm": True, "mlp": "swiglu", "tie": False, "zero_init": True,
                     "softcap": 15.0}),
    ("transformer", {"dim": 32, "layers": 1, "heads": 4, "block_size": T, "dropout": 0.0, "mlp": "relu2"}),
]


def counted_train_flops(model, x, y) -> int:
    """FLOPs torch counts for one forward and backward pass over a (B, T) batch. Attention runs on SDPA's math
    kernel here, whose matmuls the counter sees (it has no formula for the fused CPU kernel); the count is the same."""
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        logits, _, _ = model(x, None)
        F.cross_entropy(logits.flatten(0, 1), y.flatten()).backward()
    return counter.get_total_flops()


@pytest.mark.parametrize("family, arch", CASES)
def test_formula_equals_torch_count(family, arch):
    torch.manual_seed(0)
    model = build_model(family, arch, V, 0)
    x, y = torch.randint(0, V, (B, T)), torch.randint(0, V, (B, T))
    expected = B * T * train_flops_per_token(family, arch_with_defaults(family, arch), V, T)
    assert counted_train_flops(model, x, y) == expected


@pytest.mark.parametrize("cell, layers, tie", [("lstm", 2, True), ("gru", 1, True), ("rnn_tanh", 2, False)])
def test_rnn_formula_equals_an_unrolled_cell_count(cell, layers, tie):
    """torch's fused RNN kernels are not counted by FlopCounterMode, so the count is checked on the same
    layer sizes unrolled into the linear maps every cell computes per step (gates x (input + hidden))."""
    from lmpipe.flops import GATES

    arch = arch_with_defaults("rnn", {"cell": cell, "emb": 12, "hidden": 20, "layers": layers, "tie": tie})
    model = build_model("rnn", arch, V, 0)
    gates = GATES[cell]
    matmuls = [lin for rnn in model.rnns for lin in (
        torch.nn.Linear(rnn.rnn.input_size, gates * rnn.rnn.hidden_size, bias=False),
        torch.nn.Linear(rnn.rnn.hidden_size, gates * rnn.rnn.hidden_size, bias=False))]
    with FlopCounterMode(display=False) as counter:
        for lin in matmuls:
            lin(torch.randn(B * T, lin.in_features, requires_grad=True)).sum().backward()
        model.decoder(torch.randn(B * T, model.decoder.in_features, requires_grad=True)).sum().backward()
    assert counter.get_total_flops() == B * T * train_flops_per_token("rnn", arch, V, T)


def test_non_embedding_parameters_leave_out_the_tables():
    model = build_model("transformer", {"dim": 32, "layers": 2, "heads": 4, "block_size": T}, V, 0)
    per_layer = 12 * 32 * 32 + 13 * 32  # weights + biases + two LayerNorms
    assert count_non_embedding_parameters(model) == 2 * per_layer + 2 * 32  # + the final LayerNorm (head is tied)


def test_a_family_of_your_own_counts_six_n_per_training_token():
    from lmpipe.flops import train_flops_per_token

    assert train_flops_per_token("mylm", {}, 100, 16, n_params=1000) == 6000
    with pytest.raises(ValueError, match="unknown family 'mylm'"):
        train_flops_per_token("mylm", {}, 100, 16)
