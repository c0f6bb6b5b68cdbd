"""Muon with the matrices of one shape orthogonalised together (modded-nanogpt's and nanochat's batching).

`torch.optim.Muon` runs one Newton-Schulz chain per matrix: 5 iterations of 3 small matmuls each, so a 4-layer
transformer's 16 hidden matrices cost 240 kernel launches a step, most of them too small to fill the machine.
`BatchedMuon` stacks the matrices of each shape and runs one batched chain per shape (the study's transformer: 4
chains, of 4 matrices each). It is `torch.optim.Muon` in every other respect: the same settings, momentum, learning
rate adjustment, decoupled weight decay and state (a checkpoint of either resumes in the other). The update equals
torch's within bf16 rounding: both orthogonalise in bf16, and a batched matmul may sum in another order
(tests/test_muon.py states the tolerance).

One difference, by choice: `ns_dtype`, the precision of the iterations. torch's is always bf16; the Trainer passes
its training precision, so a run that trains in fp32 (a CPU without native bf16) orthogonalises in fp32 too, where
bf16 matmuls are emulated: on a 2-core AVX2 EPYC the study transformer's chains took 0.93 s a step in bf16 and
27 ms in fp32, more than its whole forward and backward pass (docs/benchmarks.md).
"""

from __future__ import annotations

from collections import defaultdict

import torch
from torch.optim._muon import _adjust_lr  # torch's own rule, so the two cannot drift apart


def orthogonalise(updates: torch.Tensor, coefficients: tuple[float, float, float], steps: int,
                  eps: float, dtype: torch.dtype) -> torch.Tensor:
    """Newton-Schulz iterations on a stack of matrices (G, A, B) at once, as torch.optim.Muon does on each: in
    `dtype` (torch's: bf16), the wide orientation, each matrix scaled to Frobenius norm 1 first."""
    a, b, c = coefficients
    x = updates.to(dtype)
    tall = x.size(-2) > x.size(-1)
    if tall:
        x = x.mT
    x = x / x.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.mT
        x = torch.baddbmm(x, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.mT if tall else x


class BatchedMuon(torch.optim.Muon):
    """torch.optim.Muon, one batched Newton-Schulz chain per shape of matrix, in `ns_dtype` (torch's: bf16)."""

    def __init__(self, params, ns_dtype: torch.dtype = torch.bfloat16, **settings):
        super().__init__(params, **settings)
        self.ns_dtype = ns_dtype

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params, grads, buffers = [], [], []
            self._init_group(group, params, grads, buffers)
            lr, momentum = float(group["lr"]), group["momentum"]
            shapes = defaultdict(list)
            for i, p in enumerate(params):
                shapes[(tuple(p.shape), p.dtype, p.device)].append(i)
            for (shape, _, _), members in shapes.items():
                ps, gs, bs = ([items[i] for i in members] for items in (params, grads, buffers))
                torch._foreach_lerp_(bs, gs, 1 - momentum)
                updates = torch._foreach_lerp(gs, bs, momentum) if group["nesterov"] else bs
                ortho = orthogonalise(torch.stack(updates), group["ns_coefficients"], group["ns_steps"], group["eps"],
                                      self.ns_dtype)
                torch._foreach_mul_(ps, 1 - lr * group["weight_decay"])
                torch._foreach_add_(ps, list(ortho.to(ps[0].dtype).unbind(0)),
                                    alpha=-_adjust_lr(lr, group["adjust_lr_fn"], torch.Size(shape)))
        return loss
