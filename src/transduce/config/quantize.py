"""The quantize section: how ``transduce quantize`` makes a static int8 model of a float one."""

from __future__ import annotations

from dataclasses import dataclass

from .base import check, typecheck

# The vocabulary projection (logits) stays float by default: see float_layers.
FLOAT_LAYERS = ("output_proj",)
# Static int8's constants that training (train.qat) and inference (transduce quantize, loading) share:
# beside a train.qat run's weights, each fake-quantised layer's observed input magnitude
# (training/qat.py), and the scale's divisor: torchao's symmetric int8 scale is
# max |x| / ((127 - -128) / 2), so -max|x| rounds to -128.
QAT_FILE = "qat_scales.safetensors"
SYMMETRIC_LEVELS = 127.5


@dataclass(frozen=True)
class QuantizeConfig:
    """Which linear layers static int8 leaves in float32 (inference/quantize.py); checked on creation."""

    float_layers: tuple = FLOAT_LAYERS
    """Linear layers kept in float32, as names or ``fnmatch`` patterns of module names
    (``output_proj``, ``decoder_layers.*.ffn.fc2``); every other linear layer becomes static int8;
    ``()``: all of them. The default keeps the vocabulary projection in float: its input scale is
    set by a few large activations, and its rounding lands directly on the scores the search
    ranks, where a near-tie flips a word (BENCHMARKS.md, the Multi30k int8 table)."""

    def __post_init__(self) -> None:
        if isinstance(self.float_layers, list):
            object.__setattr__(self, "float_layers", tuple(self.float_layers))
        typecheck(self, "quantize")
        for pattern in self.float_layers:
            check(isinstance(pattern, str) and bool(pattern.strip()), "quantize.float_layers",
                  f"each entry must be a layer name or pattern; got {pattern!r}")
