"""Static int8: every linear layer's weights (per output row) and inputs (one scale per layer,
calibrated on a sample of source text) in int8, through torchao's
``Int8StaticActivationInt8WeightConfig`` (``torch.ao.quantization``'s eager and FX flows are
deprecated for torchao's; the ``quant`` extra).

A statically quantised model directory is its float model directory plus ``quant.safetensors``:
each ``nn.Linear``'s largest absolute input seen in calibration, by name (the observer
statistics; the scale is that / 127.5), and in its header the layers kept in float32
(``quantize.float_layers``; a file without that entry has every layer in int8). Loading
(:func:`apply_saved`, when a translation model loads) rebuilds the int8 layers from the float
weights and those scales, which gives the same int8 model every time: no pickles, and every other
tool (export, info, average) still reads the directory as the float model it came from.

Calibration and the directory it writes: :mod:`transduce.inference.quantize`.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from pathlib import Path

import torch
from torch import Tensor, nn

from ...config.quantize import SYMMETRIC_LEVELS
from ...errors import CheckpointError, ConfigError
from ...model.attention import MultiHeadAttention
from ...model.io import read_weights

FILE = "quant.safetensors"
SCHEME = "static_int8"
FLOAT_KEY = "float_layers"  # header entry: the linear layers left in float32, comma-separated
# A static int8 model decodes in int8 only where this CPU's int8 GEMM (torch._int_mm, oneDNN)
# beats its float32 GEMM by this factor; else in float32, with a notice. Measured, 1 thread,
# (64 x 512) @ (512 x 2048): 0.73 ms int8 against 7.0 ms float32 with AVX-512 VNNI; 9.5 ms against
# 8.7 ms with oneDNN held to AVX2 (ONEDNN_MAX_CPU_ISA=AVX2), the kernels of a CPU without VNNI,
# where a quantized model decoded 6.6x slower than its float32 (issue 54).
INT8_MIN_SPEEDUP = 1.5
# "auto" (the default): that choice; "always": int8 on any CPU (tests of the int8 arithmetic).
INT8_ENV = "TRANSDUCE_STATIC_INT8"

logger = logging.getLogger(__name__)


def torchao_quantization():
    try:
        import torchao.quantization as tq
    except ImportError:
        raise ConfigError("static int8 needs the 'quant' extra: pip install 'transduce[quant]' "
                          "(torchao is missing)") from None
    return tq


class StaticInt8Linear(nn.Linear):
    """``nn.Linear`` over a torchao static int8 weight. The ``weight`` parameter stays torchao's
    tensor (the reference, and what :func:`is_quantized` sees); the forward runs torchao's
    arithmetic as :class:`Int8Kernel`, in four aten ops on plain tensors kept beside it."""

    def forward(self, x: Tensor) -> Tensor:
        return Int8Kernel.of(self)(x)


# Where a StaticInt8Linear keeps its Int8Kernel (plain tensors: not in the state dict).
KERNEL = "_int8_kernel"


class Int8Kernel:
    """Static int8 ``y = x W^T + b`` through ``torch._int_mm`` (an s8s8 GEMM, int32 out) on a
    torchao ``Int8Tensor``'s own int8 weight and scales: the input rounded as torchao rounds it,
    ``round(x * (1 / scale))`` clamped to int8, and the int32 products scaled by the input's
    scale times each output row's. Integer sums are exact, so the result differs from torchao's
    linear only in the order of those two float scalings (a last-bit rounding).

    torchao's linear runs the same steps as eager Python through its tensor subclass, per call:
    quantising the input builds a second subclass tensor, the weight is transposed and on VNNI
    CPUs its column sums recomputed; at a small model's shapes that costs more than the matmul.
    Inputs in bf16/fp16 are computed in float32 and the output cast back.
    """

    def __init__(self, w_t: Tensor, inv_scale: Tensor, out_scale: Tensor, bias: Tensor | None):
        self.w_t, self.inv_scale, self.out_scale, self.bias = w_t, inv_scale, out_scale, bias  # (in, out), (), (out,)

    @classmethod
    def of(cls, linear: nn.Linear) -> "Int8Kernel":
        """``linear``'s kernel (a static int8 layer's), made on first use and kept in the layer."""
        kernel = linear.__dict__.get(KERNEL)
        if kernel is None:
            w = linear.weight.data  # torchao Int8Tensor: qdata (out, in) int8, scale (out, 1), act_quant_scale (1, 1)
            x_scale = w.act_quant_scale.float().reshape(())
            out_scale = (w.scale.float().reshape(-1) * x_scale).contiguous()
            bias = None if linear.bias is None else linear.bias.detach()
            kernel = linear.__dict__[KERNEL] = cls(w.qdata.t(), 1.0 / x_scale, out_scale, bias)
        return kernel

    @classmethod
    def side_by_side(cls, layers: list[nn.Linear]) -> "Int8Kernel | None":
        """One kernel computing static int8 ``layers`` on one input, their outputs concatenated
        (the same numbers as each on its own), when they share its scale: the Q/K/V (or K/V)
        projections of one attention, calibrated on the same input. Else None."""
        kernels = [cls.of(m) for m in layers]
        if any(not torch.equal(k.inv_scale, kernels[0].inv_scale) for k in kernels):
            return None
        bias = None if kernels[0].bias is None else torch.cat([k.bias for k in kernels])
        return cls(torch.cat([k.w_t for k in kernels], dim=1), kernels[0].inv_scale,
                   torch.cat([k.out_scale for k in kernels]), bias)

    def __call__(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, x.shape[-1]).float()                                       # (N, in)
        q = torch.round(rows * self.inv_scale).clamp_(-128, 127).to(torch.int8)        # (N, in) int8
        y = torch._int_mm(q, self.w_t).float()                                          # (N, out)
        y = y.mul_(self.out_scale) if self.bias is None else torch.addcmul(self.bias, y, self.out_scale)
        return y.view(*x.shape[:-1], y.shape[-1]).to(x.dtype)


class StaticInt8Attention(MultiHeadAttention):
    """Attention whose Q/K/V projections run as their own (int8) layers: the reference's one
    matmul over their weights side by side reads float weights (as QAT's
    :class:`~transduce.training.qat.FakeQuantAttention`). Decoding switches it to
    :class:`~.fast_layers.FastAttention` like any other, which does the same."""

    def project(self, x: Tensor, layers: tuple[nn.Linear, ...]) -> tuple[Tensor, ...]:
        return tuple(self.split_heads(m(x)) for m in layers)                    # (B, H, T, Dh) each


def linear_names(model: nn.Module) -> list[str]:
    """The names of ``model``'s ``nn.Linear`` layers (plain float ones), in module order."""
    return [name for name, m in model.named_modules() if isinstance(m, nn.Linear) and not is_quantized(m)]


def is_quantized(module: nn.Module) -> bool:
    """Whether a linear layer's weight is a quantised tensor (a torchao tensor subclass)."""
    weight = getattr(module, "weight", None)
    return isinstance(weight, Tensor) and type(weight.data) is not Tensor


def quantize_static(model: nn.Module, absmax: dict[str, float], keep_float: tuple[str, ...] = ()) -> nn.Module:
    """``model`` (CPU, float32) with each linear layer in static int8 but those named in
    ``keep_float``, in place: weights per output row, inputs with the scale ``absmax / 127.5``;
    returns ``model``."""
    tq = torchao_quantization()
    from torchao.quantization.granularity import PerRow, PerTensor
    missing = sorted(set(linear_names(model)) - set(absmax) - set(keep_float))
    if missing:
        raise CheckpointError(f"{FILE}: no calibrated scale for {len(missing)} linear layer(s), e.g. {missing[0]}")
    model.to("cpu").float().eval()
    for name in [n for n in absmax if n not in keep_float]:
        scale = torch.tensor(max(absmax[name], 1e-8) / SYMMETRIC_LEVELS).reshape(1, 1)  # per tensor, (N, D) inputs
        config = tq.Int8StaticActivationInt8WeightConfig(act_quant_scale=scale, granularity=[PerTensor(), PerRow()],
                                                         set_inductor_config=False)
        tq.quantize_(model, config, filter_fn=lambda _m, fqn, name=name: fqn == name)
        model.get_submodule(name).__class__ = StaticInt8Linear
    for module in model.modules():
        if type(module) is MultiHeadAttention:
            module.__class__ = StaticInt8Attention
    return model


def read_scales(directory: str | os.PathLike) -> dict[str, float] | None:
    """The calibrated input maxima saved in a model directory, or None for a float one."""
    path = Path(directory) / FILE
    if not path.is_file():
        return None
    return {name: float(t) for name, t in read_weights(path).items()}


def read_float_layers(directory: str | os.PathLike) -> tuple[str, ...]:
    """The linear layers a static int8 model directory keeps in float32 (its header's entry)."""
    from safetensors import safe_open
    with safe_open(str(Path(directory) / FILE), framework="pt") as f:
        names = (f.metadata() or {}).get(FLOAT_KEY, "")
    return tuple(n for n in names.split(",") if n)


@functools.lru_cache(maxsize=1)
def int8_gemm_speedup(rows: int = 64, inner: int = 512, out: int = 512) -> float:
    """How many times faster this CPU multiplies int8 than float32 matrices (``torch._int_mm``
    against ``torch.mm``, the fastest of five runs each, at the threads set now): about 10 where
    oneDNN has VNNI or AMX kernels, below 1 where it has neither. Measured once per process."""
    a, b = torch.randint(-127, 128, (rows, inner), dtype=torch.int8), torch.randint(-127, 128, (inner, out),
                                                                                    dtype=torch.int8)
    af, bf = a.float(), b.float()

    def fastest(fn) -> float:
        fn()
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times)

    return fastest(lambda: torch.mm(af, bf)) / fastest(lambda: torch._int_mm(a, b))


def int8_pays() -> bool:
    """Whether static int8 is worth running here (:data:`INT8_MIN_SPEEDUP`, :data:`INT8_ENV`)."""
    choice = os.environ.get(INT8_ENV, "auto")
    if choice not in ("auto", "always"):
        raise ConfigError(f"{INT8_ENV}: must be auto or always; got {choice!r}")
    return choice == "always" or int8_gemm_speedup() >= INT8_MIN_SPEEDUP


def apply_saved(model: nn.Module, directory: str | os.PathLike) -> nn.Module:
    """``model``, loaded from ``directory``, in static int8 if the directory says so (CPU only)
    and this CPU runs int8 faster than float32 (:func:`int8_pays`; else float32, with a notice)."""
    absmax = read_scales(directory)
    if absmax is None:
        return model
    if next(model.parameters()).device.type != "cpu":
        raise ConfigError(f"runtime.device: {directory} is a static int8 model, which runs on the CPU")
    if not int8_pays():
        logger.warning("%s: static int8 would run slower than float32 on this CPU (its int8 matrix product is "
                       "%.2fx float32's: no VNNI or AMX kernels); decoding in float32 (%s=always forces int8)",
                       directory, int8_gemm_speedup(), INT8_ENV)
        return model
    return quantize_static(model, absmax, read_float_layers(directory))
