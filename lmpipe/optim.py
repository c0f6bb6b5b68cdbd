"""Muon on the hidden matrices and AdamW on everything else, as one optimiser (nanochat's split).

Muon (Jordan et al. 2024; `lmpipe.muon.BatchedMuon`, `torch.optim.Muon` with the matrices of one shape
orthogonalised together) orthogonalises each 2-D update by Newton-Schulz iterations; it is
made for the weights between hidden layers only. Embeddings, the output head (a matrix with a vocabulary-sized
side), norms and biases stay with AdamW. Muon scales its update to AdamW's RMS (`match_rms_adamw`, Liu et al. 2025),
so one learning rate and one schedule serve both parts.
"""

from __future__ import annotations

import torch
from torch import nn

from lmpipe.muon import BatchedMuon


def muon_split(model: nn.Module, vocab_size: int) -> tuple[list, list]:
    """(the hidden matrices Muon takes, the parameters AdamW takes); a tied parameter once."""
    tables = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    matrices, rest = [], []
    for p in model.parameters():  # parameters() yields a shared (tied) tensor once
        hidden = p.ndim == 2 and id(p) not in tables and vocab_size not in p.shape
        (matrices if hidden else rest).append(p)
    return matrices, rest


class MuonAdamW:
    """The two optimisers behind the one interface the Trainer uses: param_groups, state, zero_grad, step and
    a state dict that resumes both exactly."""

    def __init__(self, model: nn.Module, vocab_size: int, lr: float, weight_decay: float, ns_dtype: torch.dtype):
        """`ns_dtype`: the precision of Muon's Newton-Schulz chain, the run's training precision (lmpipe.muon)."""
        matrices, rest = muon_split(model, vocab_size)
        self.muon = BatchedMuon(matrices, ns_dtype, lr=lr, weight_decay=weight_decay, adjust_lr_fn="match_rms_adamw")
        self.adamw = torch.optim.AdamW(rest, lr=lr, weight_decay=weight_decay)

    @property
    def param_groups(self) -> list[dict]:
        return self.muon.param_groups + self.adamw.param_groups

    @property
    def state(self) -> dict:
        return {**self.muon.state, **self.adamw.state}

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.muon.zero_grad(set_to_none=set_to_none)
        self.adamw.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        self.muon.step()
        self.adamw.step()

    def state_dict(self) -> dict:
        return {"muon": self.muon.state_dict(), "adamw": self.adamw.state_dict()}

    def load_state_dict(self, saved: dict) -> None:
        self.muon.load_state_dict(saved["muon"])
        self.adamw.load_state_dict(saved["adamw"])
