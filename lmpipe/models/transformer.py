"""GPT-style causal decoder: pre-LayerNorm blocks, learned positions, SDPA attention, tied embeddings."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lmpipe.models.base import StreamLM


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim), nn.Dropout(dropout))
        self.resid_drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        # flash / memory-efficient kernels on CUDA, a fused kernel on CPU; causal mask built in
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        x = x + self.resid_drop(self.proj(y.transpose(1, 2).reshape(b, t, d)))
        return x + self.mlp(self.ln2(x))


class TransformerLM(StreamLM):
    def __init__(self, vocab_size: int, dim: int = 256, layers: int = 4, heads: int = 4, block_size: int = 256,
                 dropout: float = 0.1, tie: bool = True, boundary: int = 0):
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim {dim} must be divisible by heads {heads}")
        self.block_size, self.boundary = block_size, boundary
        self.embed = nn.Embedding(vocab_size, dim)
        self.pos = nn.Embedding(block_size, dim)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(dim, heads, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab_size, bias=False)
        if tie:
            self.head.weight = self.embed.weight
        self.apply(self._init)
        for name, p in self.named_parameters():  # GPT-2: scale residual projections by depth
            if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, 0.0, 0.02 / (2 * layers) ** 0.5)

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
        positions = torch.arange(full.size(1), device=x.device)
        h = self.drop(self.embed(full) + self.pos(positions))
        for block in self.blocks:
            h = block(h)
        logits = self.head(self.ln_f(h[:, -t:]))
        return logits, full[:, -(self.block_size - 1):]
