"""Save and load a model directory: ``config.yaml`` + ``model.safetensors``.

Weights are stored in safetensors (never pickles). Tied matrices are stored once, under the
first name that refers to them. The header records a sha256 of the tensors; loading checks it,
the format marker, names and shapes, and raises :class:`~transduce.errors.CheckpointError` with
a one-line explanation of any mismatch, so a flipped bit is an error, never a wrong model.
``config.yaml`` is checked against ``checksums.sha256`` (see :mod:`transduce.checksums`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from ..atomic import atomic_path
from ..checksums import record, verify
from ..config import DecodeConfig, ModelConfig, from_dict, read_yaml, save_yaml
from ..errors import CheckpointError, ConfigError, one_line
from .encoder_only import EncoderOnly
from .lm import DecoderOnlyLM
from .transformer import Transformer

FORMAT = "transduce"
FORMAT_VERSION = "1"
DIGEST_KEY = "sha256"  # header metadata: weights_digest() of the tensors (files before it have none)
WEIGHTS = "model.safetensors"
CONFIG = "config.yaml"


def build_model(cfg: ModelConfig) -> torch.nn.Module:
    """A freshly initialised model of ``cfg.arch``: the paper's :class:`Transformer`
    (encoder_decoder), a :class:`DecoderOnlyLM` (decoder_only) or an :class:`EncoderOnly` (encoder_only)."""
    if cfg.arch == "decoder_only":
        return DecoderOnlyLM(cfg)
    if cfg.arch == "encoder_only":
        return EncoderOnly(cfg)
    return Transformer(cfg)


def unique_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """State dict with each tied tensor once (the first name wins), contiguous, on CPU."""
    seen: set[int] = set()
    out = {}
    for name, t in model.state_dict().items():
        key = t.data_ptr()
        if key in seen:
            continue
        seen.add(key)
        out[name] = t.detach().to("cpu").contiguous()
    return out


def weights_digest(state: dict[str, torch.Tensor]) -> str:
    """sha256 over every tensor's name, dtype, shape and bytes, in name order: what
    :func:`save_weights` records and :func:`read_weights` checks, so one flipped bit is caught."""
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}\n".encode())
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy().data)
    return h.hexdigest()


def save_weights(state: dict[str, torch.Tensor], path: str | os.PathLike,
                 metadata: dict[str, str] | None = None) -> None:
    """Write a safetensors file atomically (temporary file, then rename), with the
    :func:`weights_digest` of its tensors in the header."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {"format": FORMAT, "version": FORMAT_VERSION, **(metadata or {}), DIGEST_KEY: weights_digest(state)}
    with atomic_path(path) as tmp:
        save_file(state, str(tmp), metadata=meta)


def read_weights(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Read a safetensors file written by transduce; CheckpointError if missing/corrupt/foreign."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: weights file not found")
    try:
        from safetensors import safe_open
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
        state = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{path}: not a readable safetensors file ({one_line(e)})") from None
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a transduce checkpoint (format={meta.get('format')!r})")
    if DIGEST_KEY in meta and weights_digest(state) != meta[DIGEST_KEY]:
        raise CheckpointError(f"{path}: corrupt: its tensors do not match the checksum it was written with "
                              "(a damaged disk or copy; restore it from a good copy)")
    return state


def save_model(model: torch.nn.Module, directory: str | os.PathLike, decode: DecodeConfig | None = None,
               origin: dict[str, str] | None = None) -> Path:
    """Write ``config.yaml`` (the model's config, and the decoding settings to use it with and where
    it came from, if given: ``origin``, an import's Hugging Face repository and commit) and
    ``model.safetensors`` into ``directory`` (created if needed)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_weights(unique_state_dict(model), directory / WEIGHTS)
    config = {"model": dataclasses.asdict(model.config)}
    if decode is not None:
        config["decode"] = dataclasses.asdict(decode)
    if origin is not None:
        config["origin"] = dict(origin)
    save_yaml(config, directory / CONFIG)
    record(directory, [CONFIG])
    return directory


def load_decode_config(directory: str | os.PathLike) -> DecodeConfig:
    """The decoding settings saved with a model (``decode`` in its config.yaml), or the
    defaults for a model saved without them; a bad value is a ConfigError naming the key."""
    path = Path(directory) / CONFIG
    if not path.is_file():
        raise CheckpointError(f"{directory}: model directory not found")
    verify(directory, CONFIG)
    section = read_yaml(path).get("decode")
    if section is None:
        return DecodeConfig()
    try:
        return from_dict(DecodeConfig, section, "decode")
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def load_model_config(directory: str | os.PathLike) -> ModelConfig:
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: model directory not found")
    verify(directory, CONFIG)
    d = read_yaml(directory / CONFIG)
    if not isinstance(d, dict) or not isinstance(d.get("model"), dict):
        raise CheckpointError(f"{directory / CONFIG}: has no 'model' section")
    try:
        return from_dict(ModelConfig, d["model"], "model")
    except ConfigError as e:
        raise CheckpointError(f"{directory / CONFIG}: {e}") from None


def saved_model_settings(directory: str | os.PathLike) -> dict[str, Any] | None:
    """The ``model`` mapping saved in a model directory's config.yaml, unchecked, or None when the
    directory has no such file or section: what a run with ``train.init_from`` lays its own model
    keys over (:func:`~transduce.config.load_run_config`). A missing directory is left for
    training to report."""
    path = Path(directory) / CONFIG
    if not path.is_file():
        return None
    saved = read_yaml(path)
    model = saved.get("model") if isinstance(saved, dict) else None
    return model if isinstance(model, dict) else None


def load_state_checked(model: torch.nn.Module, state: dict[str, torch.Tensor], source: str) -> None:
    """Load ``state`` into ``model`` after checking names and shapes; one-line errors."""
    check_state({name: tuple(t.shape) for name, t in unique_state_dict(model).items()}, state, source)
    model.load_state_dict(state, strict=False)


def check_state(expected: dict[str, tuple[int, ...]], state: dict[str, torch.Tensor], source: str) -> None:
    """A one-line CheckpointError unless ``state`` has exactly the ``expected`` names and shapes."""
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing {len(missing)} tensor(s) e.g. {missing[0]}")
        if unexpected:
            parts.append(f"unexpected {len(unexpected)} tensor(s) e.g. {unexpected[0]}")
        raise CheckpointError(f"{source}: does not match the model config: {'; '.join(parts)}")
    for name, shape in expected.items():
        if tuple(state[name].shape) != shape:
            raise CheckpointError(f"{source}: {name} has shape {tuple(state[name].shape)}, "
                                  f"the config expects {shape}")


def load_model(directory: str | os.PathLike, device: str | torch.device = "cpu") -> torch.nn.Module:
    """Load a model saved by :func:`save_model` (the class its ``model.arch`` names), in eval
    mode, on ``device``."""
    directory = Path(directory)
    cfg = load_model_config(directory)
    model = build_model(cfg)
    load_state_checked(model, read_weights(directory / WEIGHTS), str(directory / WEIGHTS))
    return model.to(device).eval()
