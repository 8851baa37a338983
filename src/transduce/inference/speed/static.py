"""Static int8: every linear layer's weights (per output row) and inputs (one scale per layer,
calibrated on a sample of source text) in int8, through torchao's
``Int8StaticActivationInt8WeightConfig`` (``torch.ao.quantization``'s eager and FX flows are
deprecated for torchao's; the ``quant`` extra).

A statically quantised model directory is its float model directory plus ``quant.safetensors``:
the calibrated input scale of each ``nn.Linear``, by name (the observer statistics). Loading
(:func:`apply_saved`, called by every front door) rebuilds the int8 layers from the float
weights and those scales, which gives the same int8 model every time: no pickles, and every other
tool (export, info, average) still reads the directory as the float model it came from.

Calibration (:func:`calibrate`) translates the sample greedily, then runs the model once over
the sample and its own translations (teacher-forced), recording each linear layer's largest
absolute input: the decoder sees what it sees when it decodes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from pathlib import Path
from typing import Iterator

import torch
from torch import Tensor, nn

from ...errors import CheckpointError, ConfigError, DataError

logger = logging.getLogger(__name__)

FILE = "quant.safetensors"
SCHEME = "static_int8"
# torchao's symmetric int8 scale is max |x| / ((127 - -128) / 2): -max|x| rounds to -128.
SYMMETRIC_LEVELS = 127.5
# Sentences per calibration batch (greedy translation, then one teacher-forced forward).
CALIBRATION_BATCH = 32


def _torchao():
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


def _keep(absmax: dict[str, float], name: str, x: Tensor) -> None:
    absmax[name] = max(absmax.get(name, 0.0), float(x.detach().abs().max()))


@contextlib.contextmanager
def _recording(model: nn.Module, absmax: dict[str, float]) -> Iterator[None]:
    """Hooks keeping, in ``absmax``, each linear layer's largest absolute input. The attention
    projections run as one matmul over their weights side by side (``MultiHeadAttention.project``),
    so theirs are read at the attention module: the query for Q (and K, V in self-attention),
    ``key_value`` for K and V."""
    from ...model.attention import MultiHeadAttention

    def linear_hook(name: str):
        return lambda _module, args: _keep(absmax, name, args[0])

    def attention_hook(name: str):
        def record(_module: nn.Module, args: tuple, kwargs: dict) -> None:
            query = args[0]
            key_value = args[1] if len(args) > 1 else kwargs.get("key_value")
            _keep(absmax, f"{name}.q_proj", query)
            if (args[4] if len(args) > 4 else kwargs.get("kv")) is None:
                for proj in ("k_proj", "v_proj"):
                    _keep(absmax, f"{name}.{proj}", query if key_value is None else key_value)
        return record

    handles = [model.get_submodule(n).register_forward_pre_hook(linear_hook(n)) for n in linear_names(model)]
    handles += [m.register_forward_pre_hook(attention_hook(n), with_kwargs=True)
                for n, m in model.named_modules() if isinstance(m, MultiHeadAttention)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def calibrate(translator, lines: list[str]) -> dict[str, float]:
    """Each linear layer's largest absolute input over ``lines`` (source sentences) and the
    model's greedy translations of them; ``translator`` a plain (float) one-model Translator."""
    from ...data.batch import collate
    model, tokenizer = translator.model, translator.tokenizer
    absmax: dict[str, float] = {}
    for i in range(0, len(lines), CALIBRATION_BATCH):
        chunk = lines[i:i + CALIBRATION_BATCH]
        outputs = translator.translate(chunk, beam=1)
        translator.close()  # the plain model again: hooks on its own linear layers see every call
        batch = collate([(tokenizer.encode(s, side="src"), tokenizer.encode(t, side="tgt"))
                         for s, t in zip(chunk, outputs)])
        with torch.inference_mode(), _recording(model, absmax):
            model(batch.src.to(translator.device), batch.tgt_in.to(translator.device))
    return absmax


def quantize_static(model: nn.Module, absmax: dict[str, float]) -> nn.Module:
    """``model`` (CPU, float32) with each named linear layer in static int8, in place: weights
    per output row, inputs with the scale ``absmax / 127.5``; returns ``model``."""
    tq = _torchao()
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


def quantize_directory(model_dir: str, calibration: str, out: str) -> dict[str, float]:
    """Calibrate ``model_dir`` on the source sentences in ``calibration`` and write the static
    int8 model directory ``out`` (atomically); returns the calibrated maxima."""
    from ...atomic import atomic_dir
    from ...data.corpus import read_lines
    from ...model.io import save_weights
    from ..runtime import load
    if read_scales(model_dir) is not None:
        raise ConfigError(f"{model_dir}: already a static int8 model (it has {FILE}); quantize its float model")
    _torchao()
    lines = [line for line in read_lines(calibration) if line.strip()]
    if not lines:
        raise DataError(f"--calibrate: {calibration} has no sentences to calibrate on")
    from ...config import Runtime
    with load(model_dir, Runtime(device="cpu")) as translator:
        if not hasattr(translator, "tokenizer") or not isinstance(translator.model, nn.Module) \
                or not hasattr(translator.model, "encode"):
            raise ConfigError(f"{model_dir}: static int8 is for translation models (one model directory)")
        absmax = calibrate(translator, lines)
    with atomic_dir(out) as tmp:
        shutil.copytree(model_dir, tmp, dirs_exist_ok=True)
        save_weights({name: torch.tensor(v) for name, v in absmax.items()}, tmp / FILE, {"scheme": SCHEME})
    logger.info("calibrated %d linear layers on %d sentences", len(absmax), len(lines))
    return absmax
