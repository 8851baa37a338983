"""Quantisation-aware training (``train.qat``): the linear layers train through the rounding of
the static int8 model that ``transduce quantize`` makes of them (Jacob et al., 2018), so the
weights learn to live with it.

Each ``nn.Linear`` becomes a :class:`FakeQuantLinear`: its weight rounded to int8 per output
row and its input per tensor (symmetric, scale = largest magnitude / 127.5, as
:mod:`~transduce.inference.speed.static_int8` quantises them), through PyTorch's
``fake_quantize_per_channel_affine`` / ``fake_quantize_per_tensor_affine``, whose gradient is
the straight-through estimator. torchao's QAT configs fake-quantise activations per token only,
not per tensor as the static int8 model computes. Attention projections run one layer at a time
(:class:`FakeQuantAttention`), so each sees its own rounding. The layers ``transduce quantize``
keeps in float32 by default (``quantize.float_layers``: the vocabulary projection) train in
float32 too. Parameters, names and the state
dict stay as they are: checkpoints, resume and the saved model are a float model's, which
``transduce quantize`` then converts.

The input's largest magnitude is an observer's, as static int8 has one fixed scale per layer: a
moving average of each training batch's (PyTorch's ``MovingAverageMinMaxObserver``, averaging
constant 0.01), not the batch's own, which would round every batch on its own grid (finer or
coarser than the deployed one, and never clipping). The observers are saved beside the weights
(``qat_scales.safetensors`` in checkpoints and model directories; resume restores them), and
``transduce quantize`` takes them as the static int8 model's input scales: it rounds as the
run trained.

Under data parallelism (DDP or FSDP) every rank observes its own batches and the observers are
averaged over the ranks after each step (:func:`average_observers`), so the scale follows all the
data: the moving average of the ranks' mean (the update is linear in the batch's magnitude).
Without it DDP's buffer broadcast would set them all to rank 0's before each step.
"""

from __future__ import annotations

from fnmatch import fnmatchcase

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import QuantizeConfig
from ..config.quantize import SYMMETRIC_LEVELS
from ..model.attention import MultiHeadAttention

QMIN, QMAX = -128, 127
AVERAGING = 0.01  # the observers' averaging constant (torch.ao's MovingAverageMinMaxObserver's default)
OBSERVER = "input_absmax"  # each FakeQuantLinear's buffer: the moving average of its input's largest magnitude


def _symmetric_scale(absmax: Tensor) -> Tensor:
    return (absmax.detach().float() / SYMMETRIC_LEVELS).clamp_min(1e-8)


class FakeQuantLinear(nn.Linear):
    """``nn.Linear`` computing with int8-rounded weights (per row) and inputs (per tensor, by the
    observed scale: see the module docstring)."""

    input_absmax: Tensor  # () float32; 0 until the first batch

    def forward(self, x: Tensor) -> Tensor:
        w = self.weight
        w_scale = _symmetric_scale(w.abs().amax(dim=1))                                    # (out,)
        zeros = torch.zeros(w.shape[0], dtype=torch.int32, device=w.device)
        w = torch.fake_quantize_per_channel_affine(w, w_scale, zeros, 0, QMIN, QMAX)
        x_scale = _symmetric_scale(self._observe(x))
        x = torch.fake_quantize_per_tensor_affine(x, x_scale, torch.zeros((), dtype=torch.int32, device=x.device),
                                                  QMIN, QMAX)
        return F.linear(x, w, self.bias)

    def _observe(self, x: Tensor) -> Tensor:
        """The input magnitude to scale by: in training the observer, updated with this batch's
        largest (the first batch's as it is); in eval the observer as it stands (this input's
        largest before any training batch)."""
        batch = x.detach().abs().amax().float()
        seen = self.input_absmax > 0
        if self.training:
            self.input_absmax.copy_(torch.where(seen, torch.lerp(self.input_absmax, batch, AVERAGING), batch))
            return self.input_absmax
        return torch.where(seen, self.input_absmax, batch)


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
            # not in the state dict: the model stays a float model's; saved beside it (observed_scales)
            module.register_buffer(OBSERVER, torch.zeros((), device=module.weight.device), persistent=False)
        elif type(module) is MultiHeadAttention:
            module.__class__ = FakeQuantAttention
    return model



def observed_scales(model: nn.Module) -> dict[str, Tensor]:
    """Each fake-quantised layer's observed input magnitude, by layer name (those that saw a
    batch): what ``transduce quantize`` takes as the static int8 input scales (times 1/127.5)."""
    return {name: m.input_absmax.detach().cpu().clone() for name, m in model.named_modules()
            if type(m) is FakeQuantLinear and float(m.input_absmax) > 0}


def average_observers(model: nn.Module) -> None:
    """Set every fake-quantised layer's observer to its mean over the ranks of the default process
    group (one all-reduce); nothing without one."""
    import torch.distributed as dist
    observers = [m.input_absmax for m in model.modules() if type(m) is FakeQuantLinear]
    if not observers or not dist.is_initialized():
        return
    flat = torch.stack(observers)
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    for observer, mean in zip(observers, flat):
        observer.copy_(mean)


def restore_scales(model: nn.Module, scales: dict[str, Tensor]) -> None:
    """Set the observers of ``model``'s fake-quantised layers from :func:`observed_scales`' output
    (a resumed run continues them; a layer absent from ``scales`` starts again)."""
    for name, m in model.named_modules():
        if type(m) is FakeQuantLinear:
            m.input_absmax.fill_(float(scales[name]) if name in scales else 0.0)
