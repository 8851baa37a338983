"""Static int8: every linear layer's weights (per output row) and inputs (one scale per layer,
calibrated on a sample of source text) in int8, through torchao's
``Int8StaticActivationInt8WeightConfig`` (``torch.ao.quantization``'s eager and FX flows are
deprecated for torchao's; the ``quant`` extra).

A statically quantised model directory is its float model directory plus ``quant.safetensors``:
each ``nn.Linear``'s largest absolute input seen in calibration, by name (the observer
statistics; the scale is that / 127.5). Loading (:func:`apply_saved`, when a translation model
loads) rebuilds the int8 layers from the float
weights and those scales, which gives the same int8 model every time: no pickles, and every other
tool (export, info, average) still reads the directory as the float model it came from.

Calibration and the directory it writes: :mod:`transduce.inference.quantize`.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import Tensor, nn

from ...errors import CheckpointError, ConfigError

FILE = "quant.safetensors"
SCHEME = "static_int8"
# torchao's symmetric int8 scale is max |x| / ((127 - -128) / 2): -max|x| rounds to -128.
SYMMETRIC_LEVELS = 127.5


def torchao_quantization():
    try:
        import torchao.quantization as tq
    except ImportError:
        raise ConfigError("static int8 needs the 'quant' extra: pip install 'transduce[quant]' "
                          "(torchao is missing)") from None
    return tq


class StaticInt8Linear(nn.Linear):
    """``nn.Linear`` over a torchao static int8 weight: inputs of any rank run as (N, D) rows,
    the one shape the calibrated per-tensor scale (of shape (1, 1)) applies to."""

    def forward(self, x: Tensor) -> Tensor:
        y = torch.nn.functional.linear(x.reshape(-1, x.shape[-1]), self.weight, self.bias)  # (N, out)
        return y.view(*x.shape[:-1], y.shape[-1])


def linear_names(model: nn.Module) -> list[str]:
    """The names of ``model``'s ``nn.Linear`` layers (plain float ones), in module order."""
    return [name for name, m in model.named_modules() if isinstance(m, nn.Linear) and not is_quantized(m)]


def is_quantized(module: nn.Module) -> bool:
    """Whether a linear layer's weight is a quantised tensor (a torchao tensor subclass)."""
    weight = getattr(module, "weight", None)
    return isinstance(weight, Tensor) and type(weight.data) is not Tensor


def quantize_static(model: nn.Module, absmax: dict[str, float]) -> nn.Module:
    """``model`` (CPU, float32) with each named linear layer in static int8, in place: weights
    per output row, inputs with the scale ``absmax / 127.5``; returns ``model``."""
    tq = torchao_quantization()
    from torchao.quantization.granularity import PerRow, PerTensor
    missing = sorted(set(linear_names(model)) - set(absmax))
    if missing:
        raise CheckpointError(f"{FILE}: no calibrated scale for {len(missing)} linear layer(s), e.g. {missing[0]}")
    model.to("cpu").float().eval()
    for name in list(absmax):
        scale = torch.tensor(max(absmax[name], 1e-8) / SYMMETRIC_LEVELS).reshape(1, 1)  # per tensor, (N, D) inputs
        config = tq.Int8StaticActivationInt8WeightConfig(act_quant_scale=scale, granularity=[PerTensor(), PerRow()],
                                                         set_inductor_config=False)
        tq.quantize_(model, config, filter_fn=lambda _m, fqn, name=name: fqn == name)
        model.get_submodule(name).__class__ = StaticInt8Linear
    return model


def read_scales(directory: str | os.PathLike) -> dict[str, float] | None:
    """The calibrated input maxima saved in a model directory, or None for a float one."""
    from ...model.io import read_weights
    path = Path(directory) / FILE
    if not path.is_file():
        return None
    return {name: float(t) for name, t in read_weights(path).items()}


def apply_saved(model: nn.Module, directory: str | os.PathLike) -> nn.Module:
    """``model``, loaded from ``directory``, in static int8 if the directory says so (CPU only)."""
    absmax = read_scales(directory)
    if absmax is None:
        return model
    if next(model.parameters()).device.type != "cpu":
        raise ConfigError(f"runtime.device: {directory} is a static int8 model, which runs on the CPU")
    return quantize_static(model, absmax)
