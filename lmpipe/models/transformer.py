"""GPT-style causal decoder with SDPA attention, from the 2019 GPT-2 recipe to today's small-budget one.

Each modern part is a setting, so an ablation changes one at a time (docs/tuning.md):
- `position`: `learned` absolute embeddings (GPT-2) or `rope` (rotary, Su et al. 2021) on queries and keys;
- `norm`: `layernorm` or `rmsnorm`; `qk_norm` normalises queries and keys per head (an RMS norm without weights);
- `mlp`: `gelu` (4d), `relu2` (ReLU squared, 4d) or `swiglu` (gated SiLU, 8d/3 wide: the same parameters);
- `tie`: the head shares the embedding; untied, `zero_init` starts the head and the residual projections at zero
  (modded-nanogpt, nanochat), so each block starts as the identity;
- `softcap`: logits = c * tanh(logits / c) when c > 0 (Gemma 2, modded-nanogpt).
The defaults are GPT-2's, so a params file that names none of these trains what it always did.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lmpipe.families import TransformerArch
from lmpipe.models.base import StreamLM

def mlp_hidden(dim: int, mlp: str) -> int:
    """The MLP's inner width: 4d, or 8d/3 for the gated SwiGLU (three matrices instead of two, same parameters)."""
    return 8 * dim // 3 if mlp == "swiglu" else 4 * dim


def _norm(kind: str, dim: int) -> nn.Module:
    return nn.LayerNorm(dim) if kind == "layernorm" else nn.RMSNorm(dim)


class Activation(nn.Module):
    """The MLP's nonlinearity; `swiglu` gates one half of its input with the SiLU of the other."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.kind == "swiglu":
            gate, value = h.chunk(2, dim=-1)
            return F.silu(gate) * value
        return F.gelu(h) if self.kind == "gelu" else F.relu(h).square()


class Dropout(nn.Dropout):
    """nn.Dropout, its mask on a CPU drawn as uniform floats compared with p: there `bernoulli_` (F.dropout's draw)
    takes 3x as long as `torch.rand` for the same mask shape (docs/benchmarks.md). Elsewhere F.dropout itself."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0 or x.device.type != "cpu":
            return super().forward(x)
        keep = torch.rand_like(x, dtype=torch.float32) >= self.p
        return x * (keep / (1 - self.p)).to(x.dtype)


def mlp_block(dim: int, kind: str, dropout: float) -> nn.Sequential:
    hidden = mlp_hidden(dim, kind)
    return nn.Sequential(nn.Linear(dim, 2 * hidden if kind == "swiglu" else hidden), Activation(kind),
                         nn.Linear(hidden, dim), Dropout(dropout))


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """Scaled dot-product attention (SDPA: flash / memory-efficient kernels on CUDA, a fused kernel on a CPU).

    On a CPU in fp32 whatever the training precision: there SDPA's bf16 kernel runs at 0.4x its fp32 one at the
    study's shape, forward and backward (docs/benchmarks.md), and fp32 is the more exact of the two."""
    if q.device.type == "cpu":  # autocast would cast the inputs to bf16 again
        with torch.autocast("cpu", enabled=False):
            return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal).to(v.dtype)
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each pair of channels (first half, second half) of (batch, heads, time, head_dim) by its angle."""
    a, b = x.chunk(2, dim=-1)
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float, norm: str = "layernorm", qk_norm: bool = False,
                 mlp: str = "gelu"):
        super().__init__()
        self.heads, self.qk_norm = heads, qk_norm
        self.ln1, self.ln2 = _norm(norm, dim), _norm(norm, dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = mlp_block(dim, mlp, dropout)
        self.resid_drop = Dropout(dropout)

    def forward(self, x: torch.Tensor, rope: tuple | None = None) -> torch.Tensor:
        q, k, v = self._qkv(x, rope)
        # flash / memory-efficient kernels on CUDA, a fused kernel on CPU; causal mask built in. No dropout on the
        # attention weights (as in modded-nanogpt and nanochat): its mask forced SDPA's slow math path on the CPU and
        # cost more than the attention itself (docs/benchmarks.md); `dropout` acts on the residual stream
        return self._mix(x, attend(q, k, v, causal=True))

    def decode(self, x: torch.Tensor, rope: tuple | None, cache: tuple | None = None):
        """`forward` that keeps the keys and values: with a `cache` of the earlier positions' (k, v), x is the one
        next position, which attends to all of them."""
        q, k, v = self._qkv(x, rope)
        if cache is not None:
            k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
        return self._mix(x, attend(q, k, v, causal=cache is None)), (k, v)

    def _qkv(self, x: torch.Tensor, rope: tuple | None):
        b, t, d = x.shape
        qkv = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        qk, v = qkv[:2], qkv[2]  # queries and keys normalised and rotated together: half the kernel launches
        if self.qk_norm:
            qk = F.rms_norm(qk, (qk.size(-1),))
        if rope is not None:
            qk = rotary(qk, *rope)
        return qk[0], qk[1], v

    def _mix(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The attention's output y (batch, heads, time, head_dim) into the residual stream, then the MLP."""
        b, t, d = x.shape
        x = x + self.resid_drop(self.proj(y.transpose(1, 2).reshape(b, t, d)))
        return x + self.mlp(self.ln2(x))


class TransformerLM(StreamLM):
    def __init__(self, vocab_size: int, boundary: int = 0, **arch):
        """`arch`: lmpipe.families.TransformerArch's settings (their defaults and checks)."""
        super().__init__()
        a = TransformerArch(**arch)
        dim, layers, heads, block_size, dropout, tie = a.dim, a.layers, a.heads, a.block_size, a.dropout, a.tie
        position, norm, qk_norm, mlp, zero_init, softcap = a.position, a.norm, a.qk_norm, a.mlp, a.zero_init, a.softcap
        self.block_size, self.boundary, self.softcap = block_size, boundary, softcap
        self.embed = nn.Embedding(vocab_size, dim)
        self.pos = nn.Embedding(block_size, dim) if position == "learned" else None
        self.drop = Dropout(dropout)
        self.blocks = nn.ModuleList(Block(dim, heads, dropout, norm, qk_norm, mlp) for _ in range(layers))
        self.ln_f = _norm(norm, dim)
        self.head = nn.Linear(dim, vocab_size, bias=False)
        if tie:
            self.head.weight = self.embed.weight
        if position == "rope":  # angles of every position the window can hold: a buffer, not a parameter
            half = dim // heads // 2
            angles = torch.outer(torch.arange(block_size).float(), 10000.0 ** (-torch.arange(half).float() / half))
            self.register_buffer("rope_cos", angles.cos(), persistent=False)
            self.register_buffer("rope_sin", angles.sin(), persistent=False)
        self.apply(self._init)
        for name, p in self.named_parameters():  # GPT-2: scale residual projections by depth; or start them at 0
            if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.zeros_(p) if zero_init else nn.init.normal_(p, 0.0, 0.02 / (2 * layers) ** 0.5)
        if zero_init:
            nn.init.zeros_(self.head.weight)

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, 0.0, 0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, x: torch.Tensor, state=None):
        """Attend over the carried context (earlier tokens, at most block_size - T of them) and the chunk."""
        t = x.size(1)
        if t > self.block_size:
            raise ValueError(f"chunk of {t} tokens exceeds block_size {self.block_size}")
        full = x if state is None else torch.cat([state, x], dim=1)[:, -self.block_size:]
        h, rope = self._inputs(full, 0)
        for block in self.blocks:
            h = block(h, rope)
        return self._logits(h[:, -t:]), full[:, -(self.block_size - 1):], 0.0

    def _inputs(self, tokens: torch.Tensor, start: int) -> tuple[torch.Tensor, tuple | None]:
        """The embedded tokens at positions start, start + 1, ... of the window, and their rotary angles."""
        n = tokens.size(1)
        h, rope = self.embed(tokens), None
        if self.pos is not None:
            h = h + self.pos(torch.arange(start, start + n, device=tokens.device))
        else:
            rope = (self.rope_cos[start:start + n].to(h.dtype), self.rope_sin[start:start + n].to(h.dtype))
        return self.drop(h), rope

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        logits = self.head(self.ln_f(h))
        return self.softcap * torch.tanh(logits / self.softcap) if self.softcap > 0 else logits

    # Decoding with a key/value cache. The window a prediction reads slides as the evaluation's does (lmpipe.evaluate:
    # a stride of half a block): once a context passes block_size, its window restarts half a block further on and
    # that span is read afresh, so every prediction has at least half a block of context, and a token costs one
    # cached step, plus one re-read of half a block every half block.

    def window_start(self, length: int) -> int:
        if length <= self.block_size:
            return 0
        stride = max(1, self.block_size // 2)
        return ((length - self.block_size - 1) // stride + 1) * stride

    @torch.no_grad()
    def start_decoding(self, contexts):
        tokens = self._context_tensor(contexts)
        return self._read(tokens[:, self.window_start(tokens.size(1)):], tokens.size(1))

    def _read(self, window: torch.Tensor, length: int):
        """Logits after the window (the last of a context of `length` tokens), and its keys and values."""
        h, rope = self._inputs(window, 0)
        caches = []
        for block in self.blocks:
            h, cache = block.decode(h, rope)
            caches.append(cache)
        return self._logits(h[:, -1:])[:, -1], (length, window, caches)

    @torch.no_grad()
    def step_decoding(self, state, tokens: torch.Tensor, rows: torch.Tensor | None = None):
        length, window, caches = state if rows is None else self.select_state(state, rows)
        length, window = length + 1, torch.cat([window, tokens[:, None]], dim=1)
        span = length - self.window_start(length)
        if window.size(1) > span:  # the window slid: read its new span afresh
            return self._read(window[:, -span:], length)
        h, rope = self._inputs(tokens[:, None], window.size(1) - 1)
        caches = list(caches)
        for i, block in enumerate(self.blocks):
            h, caches[i] = block.decode(h, rope, caches[i])
        return self._logits(h)[:, -1], (length, window, caches)

    def select_state(self, state, rows: torch.Tensor):
        length, window, caches = state
        return length, window[rows], [(k[rows], v[rows]) for k, v in caches]

    def join_states(self, states: list):
        """Contexts of one length only: their windows slide together."""
        if len({length for length, _, _ in states}) > 1:
            return None
        caches = [(torch.cat([c[i][0] for _, _, c in states]), torch.cat([c[i][1] for _, _, c in states]))
                  for i in range(len(self.blocks))]
        return states[0][0], torch.cat([window for _, window, _ in states]), caches
