"""Batched Muon: torch.optim.Muon's update, the matrices of one shape orthogonalised together."""

from __future__ import annotations

import pytest
import torch

from lmpipe.muon import BatchedMuon

SHAPES = [(64, 64)] * 3 + [(192, 64)] * 2 + [(64, 256)] * 2 + [(256, 64), (32, 48)]  # square, tall, wide, alone
TOLERANCE = 2e-2  # of the update's own size: bf16 keeps 8 bits, and a batched matmul may sum in another order


def matrices(seed: int) -> list[torch.nn.Parameter]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=generator) / shape[1] ** 0.5) for shape in SHAPES]


def train(optimizer_class, steps: int, **settings) -> tuple[list[torch.Tensor], object]:
    params = matrices(0)
    optimizer = optimizer_class(params, lr=0.02, weight_decay=0.01, adjust_lr_fn="match_rms_adamw", **settings)
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=generator)
        optimizer.step()
    return [p.detach().clone() for p in params], optimizer


@pytest.mark.parametrize("nesterov", [True, False])
def test_the_update_equals_torchs_muon_within_bf16_rounding(nesterov):
    start = matrices(0)
    ours, _ = train(BatchedMuon, 1, nesterov=nesterov)
    torchs, _ = train(torch.optim.Muon, 1, nesterov=nesterov)
    for shape, p0, a, b in zip(SHAPES, start, ours, torchs):
        step = (b - p0 * (1 - 0.02 * 0.01)).norm()  # torch's update, weight decay aside
        assert step > 0
        assert (a - b).norm() / step < TOLERANCE, shape


def test_several_steps_stay_with_torchs_muon_and_the_state_is_torchs():
    ours, optimizer = train(BatchedMuon, 5)
    torchs, reference = train(torch.optim.Muon, 5)
    for a, b in zip(ours, torchs):
        assert (a - b).norm() / b.norm() < 1e-2
    assert optimizer.state_dict()["state"].keys() == reference.state_dict()["state"].keys()
    assert optimizer.state_dict()["param_groups"] == reference.state_dict()["param_groups"]


def test_a_resumed_optimizer_continues_bit_for_bit():
    whole, _ = train(BatchedMuon, 4)
    params = matrices(0)
    optimizer = BatchedMuon(params, lr=0.02, weight_decay=0.01, adjust_lr_fn="match_rms_adamw")
    generator = torch.Generator().manual_seed(1)
    for step in range(4):
        if step == 2:  # a checkpoint, loaded into a new optimiser over the same weights
            saved = optimizer.state_dict()
            optimizer = BatchedMuon(params, lr=0.02, weight_decay=0.01, adjust_lr_fn="match_rms_adamw")
            optimizer.load_state_dict(saved)
        for p in params:
            p.grad = torch.randn(p.shape, generator=generator)
        optimizer.step()
    assert all(torch.equal(a, b) for a, b in zip(whole, params))


def test_the_iterations_run_in_the_precision_asked_for():
    """A run that trains in fp32 orthogonalises in fp32 (bf16 is emulated, and slow, on a CPU without it): its update
    is fp64's to fp32 rounding, while torch's bf16 chain is ~1e-2 off."""
    exact, single, half = (train(BatchedMuon, 1, ns_dtype=dtype)[0]
                           for dtype in (torch.float64, torch.float32, torch.bfloat16))
    start = matrices(0)
    for p0, e, s, h in zip(start, exact, single, half):
        step = (e - p0 * (1 - 0.02 * 0.01)).norm()
        assert (s - e).norm() / step < 1e-5
        assert (h - e).norm() / step > 1e-3
