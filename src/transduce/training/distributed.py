"""Data-parallel training with torch.distributed, launched by ``torchrun``.

``torchrun --nproc_per_node=K -m transduce train ...`` sets RANK / WORLD_SIZE / LOCAL_RANK;
each process trains a replica wrapped in DistributedDataParallel (NCCL on CUDA, gloo on CPU).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_distributed(device_kind: str) -> DistInfo:
    """Join the process group described by torchrun's environment (no-op when run alone)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    info = DistInfo(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        backend = "nccl" if device_kind == "cuda" else "gloo"
        if device_kind == "cuda":
            torch.cuda.set_device(info.local_rank)
        dist.init_process_group(backend=backend)
    return info


def shutdown_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()
