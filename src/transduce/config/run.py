"""A whole run: model + data + train + decode, read from YAML with ``section.key=value`` overrides."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Iterable

from ..errors import ConfigError
from .base import apply_overrides, check, from_dict, read_yaml
from .data import DataConfig
from .decode import DecodeConfig
from .family import TASKS, TaskSpec, model_task
from .legacy import migrate_section
from .model import MODEL_PRESETS, ModelConfig
from .train import TrainConfig


@dataclass(frozen=True)
class RunConfig:
    """Everything a training run needs; what ``transduce train CONFIG.yaml`` reads."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """The model's shape and options."""
    data: DataConfig = field(default_factory=DataConfig)
    """The text, its tokenizer and its batches."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """The optimisation recipe and the training loop."""
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    """The search settings validation uses, saved with the trained model."""

    def __post_init__(self) -> None:
        arch, task = self.model.arch, model_task(self.model)
        pretraining = self.train.task == "span" and task == "translation"  # T5's, of an encoder_decoder
        check(self.train.task in (None, task) or pretraining, "train.task",
              f"{self.train.task} does not fit model.arch={arch}"
              + (f" with model.n_classes={self.model.n_classes}" if arch == "encoder_only" else "")
              + f" (it trains {task})")
        if task == "classify":
            self._check_classify()
        elif self.data.corpus == "files" and self.data.prepared is None:
            check(self.data.train_tgt is not None, "data.train_tgt", "is required when data.corpus=files")
            check(task != "translation" or self.task == "span" or self.data.train_src is not None, "data.train_src",
                  "is required when data.corpus=files (only a language model, masked LM or span corruption "
                  "trains on data.train_tgt alone)")
        self._check_positions()
        check(self.task == "translation" or not self.train.cuda_graphs, "train.cuda_graphs",
              f"is for translation training; use train.compile for train.task {self.task}")

    def _check_positions(self) -> None:
        """With learned positions, a training sentence and the tokens its task adds must fit the table."""
        extra = self.task_spec.added
        if extra and self.model.positions == "learned":
            check(self.data.max_len + extra <= self.model.max_positions, "data.max_len",
                  f"must be at most model.max_positions - {extra} ({self.model.max_positions - extra}) with "
                  f"learned positions for train.task {self.task}; got {self.data.max_len}")

    def _check_classify(self) -> None:
        d = self.data
        if d.prepared is not None:  # a prepared classification set (checked when opened)
            return
        check(d.corpus == "files", "data.corpus", "train.task classify reads text<TAB>label files "
              f"(data.corpus=files) or a prepared classification set (data.prepared); got {d.corpus}")
        check(d.train_src is not None, "data.train_src", "is required by train.task classify (text<TAB>label lines)")
        check(all(getattr(d, f"{k}_tgt") is None for k in ("train", "valid", "test")), "data.train_tgt",
              "train.task classify reads its labels from the data.*_src files (text<TAB>label); set no *_tgt")
        check(d.tokenizer is not None or self.train.init_from is not None, "data.tokenizer",
              "train.task classify needs an existing tokenizer: data.tokenizer or train.init_from")
        check(d.bpe_dropout == 0.0, "data.bpe_dropout", "is not supported by train.task classify")

    def with_init_tokenizer(self) -> "RunConfig":
        """This config with ``train.init_from``'s tokenizer as ``data.tokenizer`` when it names no
        other (nor ``data.prepared``): a run that starts from a model reads text as it did."""
        d = self.data
        if self.train.init_from is None or d.tokenizer is not None or d.prepared is not None:
            return self
        return replace(self, data=replace(d, tokenizer=self.train.init_from))

    @property
    def task(self) -> str:
        """What training optimises: ``train.task``, or the task of ``model.arch`` (an encoder_only
        model with ``model.n_classes`` >= 2: classify) when absent."""
        return self.train.task or model_task(self.model)

    @property
    def task_spec(self) -> TaskSpec:
        """What :attr:`task` is (:data:`~transduce.config.family.TASKS`)."""
        return TASKS[self.task]

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RunConfig":
        """A run config from a mapping of sections (each built by :func:`~transduce.config.from_dict`);
        ``model.preset`` (or a top-level ``preset``) names a :data:`MODEL_PRESETS` shape the model
        section's keys are laid over."""
        if not isinstance(d, dict):
            raise ConfigError(f"config: expected a mapping of sections, got {type(d).__name__}")
        sections = {f.name: f.type for f in fields(cls)}
        unknown = set(d) - set(sections) - {"preset"}
        check(not unknown, "config", f"unknown section(s) {', '.join(sorted(map(str, unknown)))}; "
              f"known: {', '.join(sections)}")
        for name in sections:
            if d.get(name) is not None and not isinstance(d[name], dict):
                raise ConfigError(f"{name}: expected a mapping, got {type(d[name]).__name__}")
        model = dict(d.get("model") or {})
        preset = model.pop("preset", None) or d.get("preset")
        if preset is not None:
            check(preset in MODEL_PRESETS, "model.preset", f"unknown preset {preset!r}")
            model = {**MODEL_PRESETS[preset], **model}
        return cls(model=from_dict(ModelConfig, model, "model"),
                   data=from_dict(DataConfig, dict(d.get("data") or {}), "data"),
                   train=from_dict(TrainConfig, dict(d.get("train") or {}), "train"),
                   decode=from_dict(DecodeConfig, dict(d.get("decode") or {}), "decode"))

    def to_dict(self) -> dict[str, Any]:
        """The sections as plain mappings (tuples as lists), as YAML holds them."""
        out = dataclasses.asdict(self)
        out["train"]["betas"] = list(self.train.betas)
        return out


def load_run_config(path: str | os.PathLike | None, overrides: Iterable[str] = (),
                    init_model: Callable[[str], dict[str, Any] | None] | None = None) -> RunConfig:
    """Read a run config from YAML (or defaults if path is None) and apply ``section.key=value``
    overrides.

    Args:
        path: the YAML file; None: the defaults.
        overrides: ``section.key=value`` strings, values parsed as YAML scalars.
        init_model: reads the ``model`` section saved in a model directory, or None where there is
            none (:func:`transduce.model.io.saved_model_settings`). Given, and with
            ``train.init_from``, the model keys the config does not give are that model's:
            fine-tuning configs name only what they change (dropouts).
    """
    d = apply_overrides(read_yaml(path) if path is not None else {}, overrides)
    if init_model is not None:
        d = _over_init_model(d, init_model)
    return RunConfig.from_dict(d)


def _over_init_model(d: dict[str, Any], init_model: Callable[[str], dict[str, Any] | None]) -> dict[str, Any]:
    """``d`` with its ``model`` section laid over the ``train.init_from`` model's. A directory that
    holds no model is a ConfigError when the config leaves ``model.arch`` to it (a resumed run's
    config names every model key: its starting model may be gone)."""
    train, model = d.get("train"), d.get("model")
    init = train.get("init_from") if isinstance(train, dict) else None
    saved = init_model(str(init)) if init else None
    if saved is None and init and not (isinstance(model, dict) and "arch" in model):
        hint = (f" (a Hugging Face model: transduce import {init} --out DIR first)"
                if os.path.isfile(os.path.join(str(init), "config.json")) else "")
        raise ConfigError(f"train.init_from: {init} is not a transduce model directory (no config.yaml with a "
                          f"model section){hint}")
    if saved is None or not isinstance(model, (dict, type(None))):
        return d
    saved, model = migrate_section("model", saved), model or {}
    merged = {**saved, **model}
    if isinstance(saved.get("attention"), dict) and isinstance(model.get("attention"), dict):
        merged["attention"] = {**saved["attention"], **model["attention"]}  # the keys it gives, over the saved
    return {**d, "model": merged}
