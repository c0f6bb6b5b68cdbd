"""Elman RNN, LSTM and GRU in one class, with the AWD-LSTM regularisers (Merity et al. 2018), each switchable.

- weight drop: DropConnect on the hidden-to-hidden matrices, in training only
- locked (variational) dropout: one mask per sequence, shared across time, on inputs, between layers, on outputs
- embedding dropout: whole rows of the embedding dropped (a word vanishes everywhere in the batch)
- AR / TAR: penalties on the last layer's activations and on their change over time
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lmpipe.families import RNNArch
from lmpipe.models.base import StreamLM

CELLS = {"rnn_tanh": nn.RNN, "rnn_relu": nn.RNN, "lstm": nn.LSTM, "gru": nn.GRU}


class LockedDropout(nn.Module):
    """Variational dropout: one mask per sequence in the batch, the same at every time step."""

    def forward(self, x: torch.Tensor, p: float) -> torch.Tensor:  # x: (B, T, H)
        if not self.training or p == 0:
            return x
        mask = x.new_empty(x.size(0), 1, x.size(2)).bernoulli_(1 - p) / (1 - p)
        return x * mask


def embedding_dropout(embed: nn.Embedding, words: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Drop whole rows of the embedding matrix, rescaling the survivors."""
    if not training or p == 0:
        return embed(words)
    mask = embed.weight.new_empty(embed.weight.size(0), 1).bernoulli_(1 - p) / (1 - p)
    return F.embedding(words, embed.weight * mask)


class WeightDrop(nn.Module):
    """DropConnect on a one-layer RNN's hidden-to-hidden matrix, applied only while training."""

    def __init__(self, rnn: nn.RNNBase, p: float):
        super().__init__()
        self.rnn, self.p = rnn, p

    def forward(self, x, hidden):
        if not self.training or self.p == 0:
            return self.rnn(x, hidden)
        dropped = {"weight_hh_l0": F.dropout(self.rnn.weight_hh_l0, self.p, training=True)}
        return torch.func.functional_call(self.rnn, dropped, (x, hidden))


class RNNModel(StreamLM):
    recurrent = True

    def __init__(self, vocab_size: int, boundary: int = 0, **arch):
        """`arch`: lmpipe.families.RNNArch's settings (their defaults and checks)."""
        super().__init__()
        a = RNNArch(**arch)
        cell, emb, hidden, layers, tie = a.cell, a.emb, a.hidden, a.layers, a.tie
        self.cell, self.layers, self.boundary = cell, layers, boundary
        self.dropout, self.dropout_input, self.dropout_hidden = a.dropout, a.dropout_input, a.dropout_hidden
        self.dropout_embedding, self.ar, self.tar = a.dropout_embedding, a.ar, a.tar
        self.embed = nn.Embedding(vocab_size, emb)
        self.lock = LockedDropout()
        sizes = [emb] + [hidden] * (layers - 1) + [emb if tie else hidden]  # the last layer matches a tied decoder
        extra = {"nonlinearity": cell.split("_")[1]} if cell.startswith("rnn_") else {}
        self.rnns = nn.ModuleList(
            WeightDrop(CELLS[cell](sizes[i], sizes[i + 1], batch_first=True, **extra), a.weight_drop)
            for i in range(layers)
        )
        self.decoder = nn.Linear(sizes[-1], vocab_size)
        if tie:
            self.decoder.weight = self.embed.weight
        nn.init.uniform_(self.embed.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)

    def forward(self, x: torch.Tensor, state=None):
        h, raw, new_state = self._read(x, state)
        aux = 0.0  # AR on the last layer's dropped-out output, TAR on its raw output (Merity et al. 2018)
        if self.training and (self.ar or self.tar):
            aux = self.ar * h.pow(2).mean() + self.tar * (raw[:, 1:] - raw[:, :-1]).pow(2).mean()
        return self.decoder(h), new_state, aux

    def _read(self, x: torch.Tensor, state):
        """The last layer's output (after its dropout, and raw) at every position, and each layer's state after x."""
        h = self.lock(embedding_dropout(self.embed, x, self.dropout_embedding, self.training), self.dropout_input)
        new_state, raw = [], h
        for i, rnn in enumerate(self.rnns):
            raw, s = rnn(h, None if state is None else state[i])
            new_state.append(s)
            last = i == len(self.rnns) - 1
            h = self.lock(raw, self.dropout if last else self.dropout_hidden)
        return h, raw, new_state

    @torch.no_grad()
    def start_decoding(self, contexts):
        """The prompt read once; logits only at its last position (a long prompt's every position: n x vocab)."""
        h, _, state = self._read(self._context_tensor(contexts), None)
        return self.decoder(h[:, -1]), state

    def select_state(self, state, rows: torch.Tensor):
        """Each layer's hidden state, (1, B, H) or an LSTM's (h, c) pair, at the batch rows `rows`."""
        return [tuple(t[:, rows] for t in s) if isinstance(s, tuple) else s[:, rows] for s in state]

    def join_states(self, states: list):
        layers = zip(*states)  # each layer's state of every context
        return [tuple(torch.cat(parts, dim=1) for parts in zip(*layer)) if isinstance(layer[0], tuple)
                else torch.cat(layer, dim=1) for layer in layers]
