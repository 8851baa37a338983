"""Label text with a trained classifier (``train.task: classify``, an encoder-only model with a
classification head); the class names are the model's ``model.labels``."""

from __future__ import annotations

import os
from typing import Sequence

import torch

from ..data.batch import pad, token_types
from ..data.labelled import encode_example
from ..data.tokenizer import load_tokenizer
from ..device import autocast_context, resolve_device
from ..errors import ConfigError
from ..config import Runtime
from ..model.io import load_model_config
from .backends.onnx import open_graphs
from .placement import apply_threads, load_model_dir, model_dirs
from .speed.cpu import quantize_dynamic_int8


class Classifier:
    """A classifier and its tokenizer: texts in, label names out.

    Args:
        model: an encoder-only model with a classification head (``train.task: classify``).
        tokenizer: its :class:`~transduce.data.tokenizer.Tokenizer`.
        runtime: device, precision and int8 (:class:`~transduce.inference.runtime.Runtime`); with
            ``backend="onnx"``, the classifier's ``encoder.onnx`` in ``engines`` (``transduce export
            --format onnx``) runs in ONNX Runtime in the model's place.
    """

    def __init__(self, model: torch.nn.Module, tokenizer, runtime: Runtime = Runtime()):
        self.device = resolve_device(runtime.device, "runtime.device")
        autocast_context(self.device, runtime.precision, "runtime.precision")  # a bad precision fails here
        if runtime.int8 and self.device.type != "cpu":
            raise ConfigError(f"runtime.int8: dynamic int8 quantisation runs on the CPU; got device {self.device}")
        if runtime.int8:
            quantize_dynamic_int8(model, inplace=True)
        self.config = model.config
        if runtime.backend != "torch":  # the exported encoder graph in the model's place
            model = open_graphs(model.config, self.device, runtime)
        self.model, self.tokenizer, self.runtime = model.to(self.device).eval(), tokenizer, runtime

    def close(self) -> None:
        """Nothing is held beyond the model; here for the front doors' common ``with`` use."""

    def __enter__(self) -> "Classifier":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @classmethod
    def load(cls, model_dir: str | os.PathLike, runtime: Runtime = Runtime()) -> "Classifier":
        """The model and tokenizer of a model directory; a one-line error for any other model."""
        model_dir = model_dirs(model_dir)[0]
        cfg = load_model_config(model_dir)
        if not (cfg.family.masked_lm and cfg.labels):
            head = " with a masked-LM head" if cfg.family.masked_lm else ""
            raise ConfigError(f"{model_dir}: classify needs a classifier (train.task classify); this is a "
                              f"model.arch={cfg.arch} model{head}")
        apply_threads(runtime)
        device = resolve_device(runtime.device, "runtime.device")
        return cls(load_model_dir(model_dir, device), load_tokenizer(model_dir), runtime)

    @torch.no_grad()
    def classify(self, texts: Sequence[str | tuple[str, ...]], batch_size: int = 64) -> list[str]:
        """The predicted label of each text or sentence pair ``(a, b)``, in order. A text is BOS +
        its tokens + EOS, a pair BOS + a + EOS + b + EOS with token type 1 for ``b EOS``, cut to
        fit ``model.max_positions``, as in training."""
        cfg, room = self.config, self.config.max_positions - 2
        examples = [(t,) if isinstance(t, str) else tuple(t) for t in texts]
        if any(len(e) == 2 for e in examples) and cfg.type_vocab_size < 2:
            raise ConfigError(f"sentence pairs need a model with two token types (model.type_vocab_size >= 2); "
                              f"this one has {cfg.type_vocab_size}")
        rows = [encode_example(self.tokenizer, e, room) for e in examples]
        order = sorted(range(len(rows)), key=lambda i: len(rows[i]))     # similar lengths batched together
        out: list[str] = [""] * len(rows)
        for lo in range(0, len(order), batch_size):
            chunk = order[lo:lo + batch_size]
            ids = pad([rows[i] for i in chunk], cfg.pad_id, bos=True, eos=True).to(self.device)  # (B, T)
            types = token_types(ids) if cfg.type_vocab_size else None    # (B, T)
            with autocast_context(self.device, self.runtime.precision):
                predicted = self.model.classify(self.model(ids, types)).argmax(-1)  # (B,)
            for i, k in zip(chunk, predicted.tolist()):
                out[i] = cfg.labels[k]
        return out
