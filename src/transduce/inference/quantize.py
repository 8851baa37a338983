"""``transduce quantize``: calibrate a translation model on a sample of source text and write its
static int8 model directory (:mod:`~transduce.inference.speed.static_int8`).

Calibration (:func:`calibrate`) translates the sample greedily, then runs the model once over
the sample and its own translations (teacher-forced), recording each linear layer's largest
absolute input: the decoder sees what it sees when it decodes. The layers named in
``quantize.float_layers`` (:class:`~transduce.config.QuantizeConfig`) stay in float32.

A model trained with ``train.qat`` has its own scales beside its weights (``qat_scales.safetensors``:
the input magnitudes its layers were rounded by in training, :mod:`transduce.training.qat`); they
are the static int8 model's, so it rounds as the run trained, and no calibration sample is needed
(one given calibrates instead, with a warning).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Iterator

import torch
from torch import Tensor, nn

from ..atomic import atomic_dir
from ..config import TASKS, QuantizeConfig, Runtime, model_task
from ..data.batch import collate
from ..data.corpus import read_lines
from ..errors import ConfigError, DataError
from ..config.quantize import QAT_FILE
from ..model.attention import MultiHeadAttention
from ..model.io import load_model_config, read_weights, save_weights
from .speed.static_int8 import FILE, FLOAT_KEY, SCHEME, linear_names, read_scales, torchao_quantization
from .translator import Translator

logger = logging.getLogger(__name__)

# Sentences per calibration batch (greedy translation, then one teacher-forced forward).
CALIBRATION_BATCH = 32


def _keep(absmax: dict[str, float], name: str, x: Tensor) -> None:
    absmax[name] = max(absmax.get(name, 0.0), float(x.detach().abs().max()))


@contextlib.contextmanager
def _recording(model: nn.Module, absmax: dict[str, float]) -> Iterator[None]:
    """Hooks keeping, in ``absmax``, each linear layer's largest absolute input. The attention
    projections run as one matmul over their weights side by side (``MultiHeadAttention.project``),
    so theirs are read at the attention module: the query for Q (and K, V in self-attention),
    ``key_value`` for K and V."""
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


def float_layer_names(model: nn.Module, patterns: tuple[str, ...]) -> tuple[str, ...]:
    """``model``'s linear layers that ``patterns`` (``quantize.float_layers``) keep in float32;
    a pattern naming none of them is a one-line error (a typo would silently quantise it)."""
    names = linear_names(model)
    for pattern in patterns:
        if not any(fnmatchcase(n, pattern) for n in names):
            raise ConfigError(f"quantize.float_layers: {pattern!r} names no linear layer of this model "
                              f"(they are named like {names[-1]!r})")
    return tuple(n for n in names if any(fnmatchcase(n, p) for p in patterns))


def quantize_directory(model_dir: str, calibration: str | None, out: str,
                       config: QuantizeConfig = QuantizeConfig()) -> dict[str, float]:
    """Write the static int8 model directory ``out`` of ``model_dir`` (atomically), the layers
    ``config.float_layers`` names kept in float32, its input scales calibrated on the source
    sentences in ``calibration`` or, without one, a QAT run's own (see the module docstring);
    returns the layers' input maxima."""
    if read_scales(model_dir) is not None:
        raise ConfigError(f"{model_dir}: already a static int8 model (it has {FILE}); quantize its float model")
    task = model_task(load_model_config(model_dir))
    if not TASKS[task].translates:
        raise ConfigError(f"{model_dir}: static int8 is for translation models; this is a train.task {task} model")
    torchao_quantization()
    trained = _qat_scales(model_dir, calibration)
    lines = _calibration_lines(calibration) if trained is None else []
    with Translator.load(model_dir, Runtime(device="cpu")) as translator:
        keep_float = float_layer_names(translator.model, config.float_layers)
        absmax = calibrate(translator, lines) if trained is None else _complete(trained, translator.model, keep_float)
    with atomic_dir(out) as tmp:
        shutil.copytree(model_dir, tmp, dirs_exist_ok=True)
        save_weights({name: torch.tensor(v) for name, v in absmax.items()}, tmp / FILE,
                     {"scheme": SCHEME, FLOAT_KEY: ",".join(keep_float)})
    logger.info("%d linear layers' scales (%s); %d kept in float32", len(absmax),
                f"calibrated on {len(lines)} sentences" if trained is None else "the QAT run's", len(keep_float))
    return absmax


def _qat_scales(model_dir: str, calibration: str | None) -> dict[str, float] | None:
    """The input scales a ``train.qat`` run saved with ``model_dir``, unless ``calibration`` is
    given (then None, with a warning when there were some); a one-line error when neither is."""
    path = Path(model_dir) / QAT_FILE
    if calibration is not None:
        if path.is_file():
            logger.warning("%s: calibrating on %s instead of the scales the QAT run trained with (%s); leave out "
                           "--calibrate to use them", model_dir, calibration, QAT_FILE)
        return None
    if not path.is_file():
        raise ConfigError(f"quantize.calibration: {model_dir} was not trained with train.qat (no {QAT_FILE}): give "
                          "a sample of source sentences to calibrate on")
    return {name: float(t) for name, t in read_weights(path).items()}


def _calibration_lines(calibration: str) -> list[str]:
    lines = [line for line in read_lines(calibration) if line.strip()]
    if not lines:
        raise DataError(f"quantize.calibration: {calibration} has no sentences to calibrate on")
    return lines


def _complete(trained: dict[str, float], model: nn.Module, keep_float: tuple[str, ...]) -> dict[str, float]:
    """A QAT run's scales, after a one-line error unless every layer to quantise has one (the
    run trained the layers ``quantize.float_layers`` named then in float32, with no observer)."""
    missing = [n for n in linear_names(model) if n not in keep_float and n not in trained]
    if missing:
        raise ConfigError(f"quantize.float_layers: the QAT run trained {missing[0]} (and {len(missing) - 1} more) in "
                          "float32, with no scale to quantise it by; keep it float, or give quantize.calibration")
    return {n: v for n, v in trained.items() if n not in keep_float}
