"""Quantisation-aware training (``train.qat``): the linear layers train through the rounding of
the static int8 model that ``transduce quantize`` makes of them (Jacob et al., 2018), so the
weights learn to live with it.

Each ``nn.Linear`` becomes a :class:`FakeQuantLinear`: its weight rounded to int8 per output
row and its input per tensor (symmetric, scale = largest magnitude / 127.5, as
:mod:`~transduce.inference.speed.static` quantises them), through PyTorch's
``fake_quantize_per_channel_affine`` / ``fake_quantize_per_tensor_affine``, whose gradient is
the straight-through estimator. torchao's QAT configs fake-quantise activations per token only,
not per tensor as the static int8 model computes. Attention projections run one layer at a time
(:class:`FakeQuantAttention`), so each sees its own rounding. The layers ``transduce quantize``
keeps in float32 by default (``quantize.float_layers``: the vocabulary projection) train in
float32 too. Parameters, names and the state
dict stay as they are: checkpoints, resume and the saved model are a float model's, which
``transduce quantize`` then converts.
"""

from __future__ import annotations

from fnmatch import fnmatchcase

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import QuantizeConfig
from ..inference.speed.static import SYMMETRIC_LEVELS
from ..model.attention import MultiHeadAttention

QMIN, QMAX = -128, 127


def _symmetric_scale(absmax: Tensor) -> Tensor:
    return (absmax.detach().float() / SYMMETRIC_LEVELS).clamp_min(1e-8)


class FakeQuantLinear(nn.Linear):
    """``nn.Linear`` computing with int8-rounded weights (per row) and inputs (per tensor)."""

    def forward(self, x: Tensor) -> Tensor:
        w = self.weight
        w_scale = _symmetric_scale(w.abs().amax(dim=1))                                    # (out,)
        zeros = torch.zeros(w.shape[0], dtype=torch.int32, device=w.device)
        w = torch.fake_quantize_per_channel_affine(w, w_scale, zeros, 0, QMIN, QMAX)
        x_scale = _symmetric_scale(x.abs().amax())
        x = torch.fake_quantize_per_tensor_affine(x, x_scale, torch.zeros((), dtype=torch.int32, device=x.device),
                                                  QMIN, QMAX)
        return F.linear(x, w, self.bias)


class FakeQuantAttention(MultiHeadAttention):
    """Attention whose Q/K/V projections run as their own (fake-quantised) layers rather than as
    one matmul over their weights side by side."""

    def project(self, x: Tensor, layers: tuple[nn.Linear, ...]) -> tuple[Tensor, ...]:
        return tuple(self.split_heads(m(x)) for m in layers)                    # (B, H, T, Dh) each


def prepare_qat(model: nn.Module, float_layers: tuple[str, ...] = QuantizeConfig().float_layers) -> nn.Module:
    """Switch ``model``'s linear layers (but those ``float_layers`` names, as ``transduce quantize``
    leaves them) and attention layers to their fake-quantised versions, in place."""
    for name, module in model.named_modules():
        if type(module) is nn.Linear and not any(fnmatchcase(name, p) for p in float_layers):
            module.__class__ = FakeQuantLinear
        elif type(module) is MultiHeadAttention:
            module.__class__ = FakeQuantAttention
    return model

