"""Analytic training compute of the neural families, so models compare at equal FLOPs, not equal seconds.

Convention (Kaplan et al. 2020, "Scaling Laws for Neural Language Models"): only matrix products count;
multiplying an (m x k) by a (k x n) matrix costs 2mkn FLOPs; embedding lookups, biases, norms,
activations and the softmax are O(width) per token and are left out. The backward pass costs twice
the forward one (gradients with respect to inputs and to weights), so a training token costs

    train_flops_per_token = 3 * forward_flops_per_token

with, per token, V the vocabulary and L the layers:

- NPLM (context n, embedding e, hidden h): 2 (n e h + h V) [+ 2 n e V with direct connections]
- RNN layer with input i, hidden h and G gate blocks (Elman 1, GRU 3, LSTM 4): 2 G h (i + h);
  plus the decoder 2 h_last V
- Transformer (width d, window T = seq_len): per layer 2 * (4 d^2 + M) (qkv 3d^2, projection d^2, and the MLP's
  matrices M: 2 d * 4d, or 3 d * 8d/3 for SwiGLU, ~8d^2 either way) plus attention 2 * 2 T d (scores Q K^T and their weighted sum of V, over the T window positions, as
  a dense attention kernel computes them); plus the head 2 d V

`tests/test_flops.py` checks these against torch.utils.flop_counter.FlopCounterMode on tiny models.
"""

from __future__ import annotations

GATES = {"rnn_tanh": 1, "rnn_relu": 1, "gru": 3, "lstm": 4}
ANALYTIC = ("nplm", "rnn", "transformer")  # the families forward_flops_per_token has a formula for


def forward_flops_per_token(family: str, arch: dict, vocab_size: int, seq_len: int) -> int:
    """Matmul FLOPs of one forward pass per token (arch: params.yaml's models.<name>.arch, defaults filled)."""
    if family == "nplm":
        n, e, h = arch["context"], arch["emb"], arch["hidden"]
        return 2 * (n * e * h + h * vocab_size + (n * e * vocab_size if arch.get("direct") else 0))
    if family == "rnn":
        emb, hidden, layers, gates = arch["emb"], arch["hidden"], arch["layers"], GATES[arch["cell"]]
        sizes = [emb] + [hidden] * (layers - 1) + [emb if arch["tie"] else hidden]
        recurrent = sum(2 * gates * out * (inp + out) for inp, out in zip(sizes, sizes[1:]))
        return recurrent + 2 * sizes[-1] * vocab_size
    if family == "transformer":
        from lmpipe.models.transformer import mlp_hidden

        d, layers, kind = arch["dim"], arch["layers"], arch.get("mlp", "gelu")
        mlp = (3 if kind == "swiglu" else 2) * d * mlp_hidden(d, kind)
        return layers * (2 * (4 * d * d + mlp) + 4 * seq_len * d) + 2 * d * vocab_size
    raise ValueError(f"unknown family {family!r}")


def train_flops_per_token(family: str, arch: dict, vocab_size: int, seq_len: int, n_params: int | None = None) -> int:
    """Forward plus backward: three times the forward matmuls. A family without a formula here (one of your own)
    counts Kaplan et al.'s 6 N per token, N its non-embedding parameters (`n_params`)."""
    if family not in ANALYTIC and n_params is not None:
        return 6 * n_params
    return 3 * forward_flops_per_token(family, arch, vocab_size, seq_len)



# Dense bf16 tensor-core peak FLOP/s by device (vendor datasheets, without sparsity); the first key found in
# torch.cuda.get_device_name() wins, so the more specific names come first.
PEAK_BF16_FLOPS = {
    "H200": 989e12,
    "H100 NVL": 835e12,
    "H100 PCIe": 756e12,
    "H100": 989e12,  # SXM ("NVIDIA H100 80GB HBM3")
    "GH200": 989e12,
    "A100": 312e12,
    "L40S": 362e12,
    "L4": 121e12,
    "A10": 125e12,
}


def peak_flops(device_name: str) -> float | None:
    """The device's bf16 peak, or None for a device not in the table (a CPU, an older GPU)."""
    return next((peak for key, peak in PEAK_BF16_FLOPS.items() if key in device_name), None)
