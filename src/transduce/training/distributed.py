"""Data-parallel training with torch.distributed, launched by ``torchrun``.

``torchrun --nproc_per_node=K -m transduce train ...`` sets RANK / WORLD_SIZE / LOCAL_RANK;
each process trains a replica wrapped in DistributedDataParallel (NCCL on CUDA, gloo on CPU).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

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


def init_distributed(device_kind: str, timeout_s: float = 600.0) -> DistInfo:
    """Join the process group described by torchrun's environment (no-op when run alone).
    Collectives give up after ``timeout_s`` seconds (``train.dist_timeout_s``): a rank that
    stopped is then an error in the others (see :func:`collective_failure`), not a freeze."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    info = DistInfo(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        backend = "nccl" if device_kind == "cuda" else "gloo"
        if device_kind == "cuda":
            torch.cuda.set_device(info.local_rank)
        timeout = timedelta(seconds=timeout_s)
        dist.init_process_group(backend=backend, store=_attempt_store(info, timeout), rank=info.rank,
                                world_size=world, timeout=timeout)
    return info


def _attempt_store(info: DistInfo, timeout: timedelta) -> dist.Store:
    """torchrun's rendezvous store, its keys prefixed with the restart attempt.

    torchrun's agent keeps one store for all the restarts of ``--max-restarts``, and the process
    group's keys (each rank's gloo address) are the same in every attempt: a restarted rank could
    read a dead rank's address from the attempt before and fail to connect ("connectFullMesh
    failed ... Connection refused"), or not, depending on which rank writes first. A prefix per
    attempt (``TORCHELASTIC_RESTART_COUNT``) keeps the attempts apart."""
    store, _, _ = next(dist.rendezvous("env://", info.rank, info.world_size, timeout=timeout))
    store.set_timeout(timeout)
    return dist.PrefixStore(f"transduce/attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)


def shutdown_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def all_gather_object(info: DistInfo, obj: object) -> list:
    """Every rank's ``obj``, in rank order (``[obj]`` when run alone); every rank must call it."""
    if not info.enabled:
        return [obj]
    gathered: list = [None] * info.world_size
    dist.all_gather_object(gathered, obj)
    return gathered


def all_reduce_sum(info: DistInfo, values: list[float], device: torch.device) -> list[float]:
    """The sums of ``values`` over every rank (``values`` when run alone), in float64 on ``device``
    (NCCL reduces only device tensors); every rank must call it."""
    if not info.enabled:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def is_collective_error(error: BaseException) -> bool:
    """Whether ``error`` came from torch.distributed's backends (a timeout, a closed connection),
    rather than from the model's own code."""
    if isinstance(error, getattr(dist, "DistError", ())):
        return True
    text = str(error).lower()
    return any(k in text for k in ("gloo", "nccl", "timed out", "connection closed", "connection reset"))


def collective_failure(info: DistInfo, step: int, timeout_s: float, error: BaseException) -> str:
    """The one-line message for a collective operation (DDP's all-reduce, a barrier) that failed
    or timed out on this rank at ``step``: another rank stopped, hung or died."""
    detail = " ".join(str(error).split())[:160]
    return (f"rank {info.rank} of {info.world_size}: a collective operation at step {step} failed within "
            f"train.dist_timeout_s={timeout_s:g} s: another rank stopped, hung or died ({detail}); "
            "resume it (resume=True; torchrun --max-restarts=N restarts it by itself)")
