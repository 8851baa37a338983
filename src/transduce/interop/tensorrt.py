"""TensorRT engines from the exported ONNX graphs: ``transduce export --format tensorrt``.

The directory holds what ``--format onnx`` writes (encoder.onnx, decoder.onnx, onnx_config.json,
the tokenizer; verified against the eager model) and beside it ``encoder.plan``,
``decoder.plan`` and ``tensorrt.json`` (:mod:`transduce.inference.backends.tensorrt` runs them:
``translate --backend tensorrt --engines DIR``). Each engine has one optimization profile
(:func:`profile_shapes`): batch rows 1..max_batch (sentences x beam), source length 1..the
longest input the model's decoding settings let through, cache length 0..the longest output
they allow, all capped by the graphs' position table (``max_positions``).

Precision (:data:`PRECISIONS`, :func:`precision_plan`): fp32 builds without TF32, so the engines
compute as eager PyTorch does in fp32. fp16 and bf16 keep the graphs' inputs and outputs fp32 and
LayerNormalization and Softmax in fp32: TensorRT 10 by its weak-typing builder flags (FP16/BF16,
with those layers' precision constrained to fp32); TensorRT 11, which removed those flags for
strongly typed networks, by converting the graph first with NVIDIA ModelOpt's AutoCast
(``convert_to_f16`` with those op types blocked).

Everything up to the build (the shapes, the precision plan, the file layout, the check that a
plan matches the TensorRT version and GPU it runs on) is plain Python, tested without TensorRT.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from ..config import DecodeConfig
from ..errors import ConfigError, one_line, require
from ..inference.backends.onnx import DECODER_ONNX, ENCODER_ONNX, ONNX_META, io_names
from ..inference.backends.tensorrt import DECODER_PLAN, ENCODER_PLAN, PLAN_META, gpu_identity, load_tensorrt
from .base import ExportError
from ..model.io import load_decode_config
from .onnx import export_onnx

logger = logging.getLogger(__name__)

PRECISIONS = ("fp32", "fp16", "bf16")
# ONNX op types (TensorRT 11: AutoCast's op_block_list) and TensorRT layer types (TensorRT 10:
# layer precision constraints) kept in fp32 at fp16/bf16: normalisation statistics and softmax
# sums are where half precision loses most.
KEEP_FP32_OPS = ("LayerNormalization", "Softmax")
KEEP_FP32_LAYERS = ("NORMALIZATION", "SOFTMAX")
# The first TensorRT version whose networks are always strongly typed (no precision builder flags).
STRONG_TYPING_MAJOR = 11


@dataclass(frozen=True)
class EngineBuild:
    """How to build engines: their ``precision`` and the most decoder rows (sentences x beam)
    one call takes, ``max_batch``."""

    precision: str = "fp32"
    max_batch: int = 128

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ConfigError(f"export.precision: must be one of {', '.join(PRECISIONS)}; got {self.precision!r}")
        if self.max_batch < 1:
            raise ConfigError(f"export.max_batch: must be >= 1; got {self.max_batch}")


@dataclass(frozen=True)
class Limits:
    """The optimization profile's sizes: max and opt for batch rows, source length and cache length."""

    max_batch: int
    max_src: int
    max_cache: int
    opt_batch: int
    opt_src: int
    opt_cache: int


def limits_for(max_positions: int, decode: DecodeConfig, max_batch: int) -> Limits:
    """The profile's sizes for a model with ``max_positions`` positions, decoded with ``decode``:
    sources up to max_input_len + EOS, outputs up to max_len_a * source + max_len_b (the cache
    holds all but the last output token), both capped by ``max_positions``; opt sizes are a
    typical sentence batch."""
    max_src = min(max_positions, decode.max_input_len + 1)
    max_out = min(max_positions, int(decode.max_len_a * max_src + decode.max_len_b))
    max_cache = max(max_out - 1, 1)
    return Limits(max_batch, max_src, max_cache, min(max_batch, 64), min(max_src, 32), min(max_cache, 32))


Shape = tuple[int, ...]


def profile_shapes(meta: dict, limits: Limits) -> dict[str, dict[str, tuple[Shape, Shape, Shape]]]:
    """(min, opt, max) shapes of every input of the two graphs, for ``meta`` (onnx_config.json):
    {"encoder": {name: (min, opt, max)}, "decoder": {...}}. The first step's cache is empty (0)."""
    h, dh, n = meta["n_heads"], meta["head_dim"], meta["n_decoder_layers"]
    b, s, t = (1, limits.opt_batch, limits.max_batch), (1, limits.opt_src, limits.max_src), \
        (0, limits.opt_cache, limits.max_cache)
    decoder = {"tokens": tuple((b[i], 1) for i in range(3)), "src_mask": tuple((b[i], s[i]) for i in range(3))}
    decoder.update({name: tuple((b[i], h, t[i], dh) for i in range(3)) for name in io_names(n, "self")})
    decoder.update({name: tuple((b[i], h, s[i], dh) for i in range(3)) for name in io_names(n, "cross")})
    return {"encoder": {"src": tuple((b[i], s[i]) for i in range(3))}, "decoder": decoder}


def trt_major(version: str) -> int:
    return int(version.split(".")[0])


def precision_plan(precision: str, trt_version: str) -> dict:
    """How ``precision`` is built with TensorRT ``trt_version``: builder flags to set, TensorRT
    layer types constrained to fp32 (TensorRT 10), or the low-precision type and ONNX op types
    kept fp32 of an AutoCast conversion before parsing (TensorRT >= 11). TF32 is always off."""
    low = {"fp32": None, "fp16": "FP16", "bf16": "BF16"}[precision]
    if low is None:
        return {"flags": [], "fp32_layers": [], "autocast": None, "fp32_ops": []}
    if trt_major(trt_version) >= STRONG_TYPING_MAJOR:
        return {"flags": [], "fp32_layers": [], "autocast": precision, "fp32_ops": list(KEEP_FP32_OPS)}
    return {"flags": [low, "PREFER_PRECISION_CONSTRAINTS"], "fp32_layers": list(KEEP_FP32_LAYERS), "autocast": None,
            "fp32_ops": []}


def plan_meta(meta: dict, build: EngineBuild, limits: Limits, trt_version: str, gpu: dict) -> dict:
    """tensorrt.json: what the plans were built with and what they take."""
    shapes = profile_shapes(meta, limits)
    return {"tensorrt": trt_version, **gpu, "precision": build.precision,
            "precision_plan": precision_plan(build.precision, trt_version), **asdict(limits),
            "profiles": {g: {k: [list(s) for s in v] for k, v in io.items()} for g, io in shapes.items()}}


def _onnx_bytes(path: Path, plan: dict) -> bytes:
    """The graph to parse: as exported, or converted by AutoCast for a strongly typed build."""
    if plan["autocast"] is None:
        return path.read_bytes()
    onnx = require("onnx", "export")
    autocast = require("modelopt.onnx.autocast.convert", "tensorrt", f"{plan['autocast']} engines with TensorRT 11")
    model = autocast.convert_to_f16(onnx.load(str(path)), low_precision_type=plan["autocast"], keep_io_types=True,
                                    op_block_list=plan["fp32_ops"])
    return model.SerializeToString()


def _constrain(trt, network, layer_types: list[str]) -> None:
    """TensorRT 10: run the layers of ``layer_types`` (and write their outputs) in fp32."""
    kinds = {getattr(trt.LayerType, name) for name in layer_types}
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        if layer.type in kinds:
            layer.precision = trt.float32
            for j in range(layer.num_outputs):
                layer.set_output_type(j, trt.float32)


def build_plan(trt, onnx_path: Path, shapes: dict[str, tuple[Shape, Shape, Shape]], plan: dict) -> bytes:
    """One serialised engine of the ONNX graph at ``onnx_path`` with one optimization profile."""
    log = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(log)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, log)
    if not parser.parse(_onnx_bytes(onnx_path, plan)):
        errors = "; ".join(one_line(str(parser.get_error(i))) for i in range(parser.num_errors))
        raise ExportError(f"TensorRT could not parse {onnx_path.name}: {errors}")
    config = builder.create_builder_config()
    if hasattr(trt.BuilderFlag, "TF32"):
        config.clear_flag(trt.BuilderFlag.TF32)  # fp32 computes as eager fp32 does
    for flag in plan["flags"]:
        config.set_flag(getattr(trt.BuilderFlag, flag))
    _constrain(trt, network, plan["fp32_layers"])
    profile = builder.create_optimization_profile()
    for name, (lo, opt, hi) in shapes.items():
        profile.set_shape(name, lo, opt, hi)
    config.add_optimization_profile(profile)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise ExportError(f"TensorRT could not build an engine of {onnx_path.name} (its log above says why)")
    return bytes(serialized)


def export_tensorrt(model_dir: str | os.PathLike, out: Path, build: EngineBuild) -> dict[str, object]:
    """The ONNX graphs of ``model_dir`` (verified) and their TensorRT engines, into ``out`` (a
    staging directory the caller renames): the ONNX checks and the engines' description."""
    import torch


    trt = load_tensorrt()
    if not torch.cuda.is_available():
        raise ExportError("export.format tensorrt: building engines needs a CUDA GPU (they are built for the GPU they "
                          "run on); none is available")
    checks = export_onnx(model_dir, out)
    meta = json.loads((out / ONNX_META).read_text(encoding="utf-8"))
    limits = limits_for(meta["max_positions"], load_decode_config(model_dir), build.max_batch)
    desc = plan_meta(meta, build, limits, trt.__version__, gpu_identity(torch.device("cuda")))
    shapes = profile_shapes(meta, limits)
    plan = desc["precision_plan"]
    graphs = (("encoder", ENCODER_ONNX, ENCODER_PLAN), ("decoder", DECODER_ONNX, DECODER_PLAN))
    for graph, onnx_name, plan_name in graphs:
        logger.info("building the %s engine (%s)", graph, build.precision)
        (out / plan_name).write_bytes(build_plan(trt, out / onnx_name, shapes[graph], plan))
    (out / PLAN_META).write_text(json.dumps(desc, indent=1), encoding="utf-8")
    return {**checks, "precision": build.precision, "tensorrt": trt.__version__, "max_batch": limits.max_batch}
