"""Bengio et al. (2003) neural probabilistic LM: y = b + W x + U tanh(d + H x), x = concat of n-1 embeddings."""

from __future__ import annotations

import torch
from torch import nn

from lmpipe.families import NPLMArch
from lmpipe.models.base import StreamLM


class NPLM(StreamLM):
    def __init__(self, vocab_size: int, boundary: int = 0, **arch):
        """`arch`: lmpipe.families.NPLMArch's settings (their defaults and checks)."""
        super().__init__()
        a = NPLMArch(**arch)
        context, emb, hidden, direct, dropout = a.context, a.emb, a.hidden, a.direct, a.dropout
        self.context, self.boundary = context, boundary
        self.embed = nn.Embedding(vocab_size, emb)  # C, shared by every context position
        self.hidden = nn.Linear(context * emb, hidden)  # H and d
        self.out = nn.Linear(hidden, vocab_size)  # U and the output bias b
        self.direct = nn.Linear(context * emb, vocab_size, bias=False) if direct else None  # W
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, state=None):
        """The prediction after reading x[:, t] uses exactly the `context` tokens ending at x[:, t].

        The state is the last context-1 tokens read (boundary tokens before the stream starts).
        """
        if state is None:
            state = torch.full((x.size(0), self.context - 1), self.boundary, dtype=x.dtype, device=x.device)
        full = torch.cat([state, x], dim=1)  # (B, context - 1 + T)
        windows = full.unfold(1, self.context, 1)  # (B, T, context)
        e = self.drop(self.embed(windows).flatten(2))  # (B, T, context * emb)
        logits = self.out(self.drop(torch.tanh(self.hidden(e))))
        if self.direct is not None:
            logits = logits + self.direct(e)
        return logits, full[:, full.size(1) - (self.context - 1):], 0.0

    @torch.no_grad()
    def start_decoding(self, contexts):
        """Only the last window of the prompt is read: the one prediction it makes."""
        tokens = self._context_tensor(contexts)
        window = torch.cat([torch.full_like(tokens[:, :1], self.boundary).expand(-1, self.context), tokens], dim=1)
        return self.step_decoding(window[:, -self.context:-1], tokens[:, -1])
