"""Dropout with a cheaper mask for training on the CPU.

PyTorch's CPU dropout draws one Bernoulli sample per element (``bernoulli_``); on a small model
that is a large share of the training step (BENCHMARKS.md, "Dropout on the CPU"). This one draws
64 random bits per four elements from the same global generator (seedable, saved in checkpoints
with the rest of the RNG state) and keeps an element when its 16 bits are at least
``round(p * 65536)``; the kept elements are scaled by the exact inverse of the keep probability,
so the output's expectation is the input, as nn.Dropout's. ``p`` is thus rounded to a multiple
of 1/65536 (0.3 becomes 0.300003). ``inplace`` is accepted and ignored (a new tensor is returned).

The model keeps ``nn.Dropout`` (``model/`` is the reference); :func:`use_cpu_dropout` puts this
one in its place for a CPU training run (the trainer's choice, made once when it builds the model).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

LEVELS = 1 << 16


class CpuDropout(nn.Dropout):
    """nn.Dropout whose mask takes 16 random bits an element (see the module's docstring)."""

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0:
            return x
        return x * keep_mask(x, self.p)


def keep_mask(x: Tensor, p: float) -> Tensor:
    """A mask shaped as ``x``, in its dtype: 0 where dropped, 1 / P(keep) where kept."""
    threshold = round(p * LEVELS)  # nn.Dropout checked 0 <= p <= 1
    if threshold == LEVELS:
        return torch.zeros_like(x)
    n = x.numel()
    bits = torch.empty((n + 3) // 4, dtype=torch.int64, device=x.device).random_(-2 ** 63, None)
    draws = bits.view(torch.int16)[:n].view(x.shape)  # uniform on [-32768, 32767]
    kept = draws >= threshold - LEVELS // 2
    return kept.to(x.dtype).mul_(LEVELS / (LEVELS - threshold))


def use_cpu_dropout(model: nn.Module) -> nn.Module:
    """Make each nn.Dropout of ``model`` a :class:`CpuDropout` (in place; as ``prepare_qat`` switches
    layers: no state to add, ``p`` and the mode kept)."""
    for module in model.modules():
        if type(module) is nn.Dropout:
            module.__class__ = CpuDropout
    return model
