"""Configuration: one frozen dataclass per concern, validated on creation, YAML in and out.

A training run is described by :class:`RunConfig` = model + data + train + decode; generation,
the server and the runtime (where a model runs) have their own. Every field has a default (and a
docstring: the configuration reference); a YAML file only needs the fields it changes. ``key=value`` overrides
(``train.max_steps=100``) are parsed with YAML's scalar rules. Any bad value raises
:class:`~transduce.errors.ConfigError` whose one-line message names the key.

This package is the bottom layer beside :mod:`transduce.errors`: it imports no other package.
"""

from .attention import AttentionConfig
from .base import apply_overrides, from_dict, read_yaml, save_yaml
from .data import DataConfig
from .decode import DecodeConfig
from .generation import GenerationConfig, check_sampling
from .family import TASKS, model_task
from .model import MODEL_PRESETS, ModelConfig, model_preset, with_vocab
from .quantize import QuantizeConfig
from .run import RunConfig, load_run_config
from .runtime import WORKER_TIMEOUT_S, Runtime
from .serve import ServeConfig
from .train import EXTEND_VOCAB, TrainConfig

__all__ = [
    "ModelConfig", "AttentionConfig",
    "DataConfig", "TrainConfig", "DecodeConfig", "GenerationConfig", "ServeConfig", "RunConfig",
    "Runtime", "QuantizeConfig",
    "model_preset", "MODEL_PRESETS", "model_task", "with_vocab",
    "TASKS",
    "EXTEND_VOCAB", "WORKER_TIMEOUT_S", "check_sampling",
    "from_dict", "load_run_config", "apply_overrides", "read_yaml", "save_yaml",
]
