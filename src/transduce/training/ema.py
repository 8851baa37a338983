"""An exponential moving average of the weights (``train.ema_decay``), as fairseq's ``--ema``,
OpenNMT-py's ``average_decay`` and Marian's ``--exponential-smoothing`` keep.

After every applied optimizer step ``ema = d * ema + (1 - d) * weights``, with the decay warmed
up as TensorFlow's ``ExponentialMovingAverage(num_updates=...)``: ``d = min(ema_decay, (1 + n) /
(10 + n))`` at the ``n``-th update (counted from 0), so that a short run's average is not mostly
the initial weights. The average is kept in float32 whatever the training precision (autocast
leaves the parameters float32; a half-precision average would lose the small ``(1 - d)`` steps).
Under DDP every rank holds the same weights, so every rank holds the same average; under FSDP
(``train.fsdp``) each rank averages its shard of them.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import Tensor

from ..model.io import unique_state_dict
from .sharding import sharded_like

EMA_WEIGHTS = "ema.safetensors"  # beside model.safetensors in a checkpoint: a full state dict of the average


def ema_decay_at(decay: float, n: int) -> float:
    """The decay of the ``n``-th update (0-based): ``min(decay, (1 + n) / (10 + n))``."""
    return min(decay, (1.0 + n) / (10.0 + n))


class WeightEMA:
    """A float32 moving average of a model's parameters.

    Args:
        model: the model whose parameters are averaged (not a DDP or compile wrapper).
        decay: ``train.ema_decay``, in (0, 1).
    """

    def __init__(self, model: torch.nn.Module, decay: float):
        self.decay = decay
        self.names = [name for name, _ in model.named_parameters()]  # tied parameters once
        self.params = [p for _, p in model.named_parameters()]
        self.shadow = [p.detach().to(torch.float32, copy=True) for p in self.params]

    @torch.no_grad()
    def reset(self) -> None:
        """Start the average again from the current weights."""
        for avg, p in zip(self.shadow, self.params):
            avg.copy_(p)

    @torch.no_grad()
    def update(self, n: int) -> None:
        """Move the average towards the current weights; ``n`` counts the updates before this one."""
        weights = [p.detach().float() for p in self.params]
        torch._foreach_lerp_(self.shadow, weights, 1.0 - ema_decay_at(self.decay, n))

    def state_dict(self, model: torch.nn.Module) -> dict[str, Tensor]:
        """``model``'s unique state dict (on the CPU) with the average in place of each parameter:
        a weights file that loads as the model, and averages as one."""
        state = unique_state_dict(model)
        for name, avg in zip(self.names, self.shadow):
            if name in state:
                state[name] = avg.detach().to("cpu").contiguous()
        return state

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        """Restore the average from :meth:`state_dict`'s output (bitwise)."""
        for name, avg in zip(self.names, self.shadow):
            avg.copy_(sharded_like(state[name], avg))  # under train.fsdp, this rank's part of it

    @contextlib.contextmanager
    def applied(self) -> Iterator[None]:
        """The model holds the average inside the block, its own weights again after it."""
        with torch.no_grad():
            saved = [p.detach().clone() for p in self.params]
            for p, avg in zip(self.params, self.shadow):
                p.copy_(avg)
        try:
            yield
        finally:
            with torch.no_grad():
                for p, own in zip(self.params, saved):
                    p.copy_(own)
