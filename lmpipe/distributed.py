"""Data parallelism under `torchrun`: which process this is, and the few collectives the trainer needs.

torchrun sets WORLD_SIZE, RANK and LOCAL_RANK; without them (a plain `python`) everything here is a
no-op and the trainer runs exactly as a single process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Ranks:
    rank: int = 0
    world: int = 1
    local: int = 0
    local_world: int = 1

    @property
    def main(self) -> bool:
        """Only the main process writes checkpoints and outputs and reports to the tracker."""
        return self.rank == 0


def launched() -> Ranks:
    """This process's place in a torchrun launch (a single process when not launched by torchrun)."""
    env = os.environ
    return Ranks(int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1)), int(env.get("LOCAL_RANK", 0)),
                 int(env.get("LOCAL_WORLD_SIZE", env.get("WORLD_SIZE", 1))))


def join(ranks: Ranks, device: torch.device) -> None:
    """Join the process group: NCCL between GPUs, gloo on CPU."""
    if ranks.world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")


def mean(value: torch.Tensor, ranks: Ranks) -> torch.Tensor:
    """The mean of a tensor over all processes (itself when alone)."""
    if ranks.world == 1:
        return value
    value = value.clone()
    dist.all_reduce(value)
    return value / ranks.world


def barrier(ranks: Ranks) -> None:
    if ranks.world > 1:
        dist.barrier()


def leave(ranks: Ranks) -> None:
    if ranks.world > 1 and dist.is_initialized():
        dist.destroy_process_group()
