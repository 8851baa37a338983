"""Label text with a trained classifier (``train.task: classify``, an encoder-only model with a
classification head); the class names are the model's ``model.labels``."""

from __future__ import annotations

import os
from typing import Sequence

import torch

from ..data.batch import pad
from ..device import resolve_device
from ..errors import CheckpointError, ConfigError


class Classifier:
    """A classifier and its tokenizer: texts in, label names out."""

    def __init__(self, model: torch.nn.Module, tokenizer, device: torch.device):
        self.model, self.tokenizer, self.device = model.eval(), tokenizer, device
        self.config = model.config

    @classmethod
    def load(cls, model_dir: str | os.PathLike, device: str | torch.device = "cpu") -> "Classifier":
        """The model and tokenizer of a model directory; a one-line error for any other model."""
        from ..data.tokenizer import Tokenizer
        from ..model.io import load_model, load_model_config

        if not os.path.isdir(model_dir):
            raise CheckpointError(f"{model_dir}: model directory not found")
        cfg = load_model_config(model_dir)
        if cfg.arch != "encoder_only" or not cfg.labels:
            head = " with a masked-LM head" if cfg.arch == "encoder_only" else ""
            raise ConfigError(f"{model_dir}: classify needs a classifier (train.task classify); this is a "
                              f"model.arch={cfg.arch} model{head}")
        device = resolve_device(device)
        return cls(load_model(model_dir, device), Tokenizer.load(model_dir), device)

    @torch.no_grad()
    def classify(self, texts: Sequence[str], batch_size: int = 64) -> list[str]:
        """The predicted label of each text, in order. A text is BOS + its tokens (cut to fit
        ``model.max_positions``) + EOS, as in training."""
        cfg, room = self.config, self.config.max_positions - 2
        rows = [self.tokenizer.encode(t, "src")[:room] for t in texts]
        order = sorted(range(len(rows)), key=lambda i: len(rows[i]))     # similar lengths batched together
        out: list[str] = [""] * len(rows)
        for lo in range(0, len(order), batch_size):
            chunk = order[lo:lo + batch_size]
            ids = pad([rows[i] for i in chunk], cfg.pad_id, bos=True, eos=True).to(self.device)  # (B, T)
            predicted = self.model.classify(self.model(ids)).argmax(-1)     # (B,)
            for i, k in zip(chunk, predicted.tolist()):
                out[i] = cfg.labels[k]
        return out
