"""Text generation with a decoder-only language model (``transduce generate``, :class:`Generator`).

A prompt becomes BOS + its ids; the model reads it at once into a :class:`KVCache`, then adds
one token per step (greedy when ``temperature`` is 0, else sampled after temperature, top-k and
top-p filtering, :func:`~transduce.inference.search.sampling.filter_logits`) until EOS,
``max_new_tokens`` or the model's ``max_positions``. Prompts of the same token length share a
batch, so no row needs padding or shifted positions.
"""

from __future__ import annotations

import os
from typing import Sequence

import torch
from torch import Tensor

from ..config import GenerationConfig, ModelConfig
from ..device import resolve_device
from ..errors import CheckpointError, ConfigError, DataError
from .speed import new_cache, prepare_for_decoding, prepared, restore
from .search.sampling import filter_logits
from .search.common import step_log_probs


def check_decoder_only(config: ModelConfig, what: str) -> None:
    """One-line ConfigError unless ``config`` is a decoder-only language model."""
    if config.arch != "decoder_only":
        raise ConfigError(f"{what}: needs a decoder_only model (a language model); this one is {config.arch}")


@torch.no_grad()  # generation never needs gradients (and the pooled cache forbids them)
def generate_ids(model: torch.nn.Module, prompts: Tensor, gen: GenerationConfig,
                 generator: torch.Generator | None = None) -> list[list[int]]:
    """Continue each row of ``prompts`` (B, P), BOS first, all of one length; returns the new ids
    of each row (without EOS), at most ``max_new_tokens`` and never past ``max_positions``.

    The model runs prepared for decoding (:func:`~transduce.inference.speed.prepared`: projections
    fused once, the pooled cache, few-query attention), as search does; only the last position of
    the prompt is projected to the vocabulary.
    """
    with prepared(model):
        return _generate_ids(model, prompts, gen, generator)


def _generate_ids(model: torch.nn.Module, prompts: Tensor, gen: GenerationConfig,
                  generator: torch.Generator | None) -> list[list[int]]:
    cfg = model.config
    steps = min(gen.max_new_tokens, cfg.max_positions - prompts.shape[1])
    cache = new_cache(model)
    states = model.decode(prompts, cache, project=False).states[:, -1]  # (B, D)
    logits = model.output_proj(states)                                  # (B, V)
    done = torch.zeros(prompts.shape[0], dtype=torch.bool, device=prompts.device)
    new: list[Tensor] = []
    for step in range(steps):
        logp = step_log_probs(logits, cfg, step, gen.min_new_tokens)      # (B, V), no PAD or BOS
        if gen.temperature == 0:
            token = logp.argmax(dim=-1)                                   # (B,)
        else:
            probs = filter_logits(logp, gen.temperature, gen.top_k, gen.top_p).exp()
            token = torch.multinomial(probs, 1, generator=generator).squeeze(1)
        token = token.masked_fill(done, cfg.eos_id)
        new.append(token)
        done |= token == cfg.eos_id
        if step == steps - 1 or bool(done.all()):
            break
        logits = model.decode(token[:, None], cache).logits[:, -1]
    rows = torch.stack(new, dim=1).tolist() if new else [[] for _ in range(len(prompts))]
    return [row[:row.index(cfg.eos_id)] if cfg.eos_id in row else row for row in rows]


class Generator:
    """A language model and its tokenizer, continuing lists of prompts.

    Args:
        model: an eval-mode :class:`~transduce.model.DecoderOnlyLM`.
        tokenizer: its :class:`~transduce.data.tokenizer.Tokenizer` (the target side is the LM's).
        device: "cpu", "cuda", "cuda:1" or "auto".

    The model is prepared for decoding in place, as a :class:`~transduce.inference.Translator`
    prepares its own (:func:`~transduce.inference.speed.prepare_for_decoding`: fused projections,
    on CPU oneDNN linear layers); :meth:`close` (or leaving a ``with Generator(...)`` block) hands
    it back as it came.

    Examples:
        >>> gen = Generator.load("runs/gpt_toy/model")                       # doctest: +SKIP
        >>> gen.generate(["der Hund"], GenerationConfig(temperature=0))       # doctest: +SKIP
    """

    def __init__(self, model: torch.nn.Module, tokenizer, device: str | torch.device = "cpu"):
        check_decoder_only(model.config, "generate")
        self.device = resolve_device(device)
        self.model = prepare_for_decoding(model.to(self.device).eval(), onednn=self.device.type == "cpu")
        self.tokenizer = tokenizer
        self.config = model.config

    def close(self) -> None:
        """Undo the preparation and drop the kept weight copies (see :func:`~transduce.inference.speed.restore`)."""
        restore(self.model)

    def __enter__(self) -> "Generator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @classmethod
    def load(cls, model_dir: str | os.PathLike, device: str | torch.device = "cpu") -> "Generator":
        """The model and tokenizer of a model directory; a one-line error for another arch."""
        from ..data.tokenizer import Tokenizer
        from ..model.io import load_model, load_model_config

        if not os.path.isdir(model_dir):
            raise CheckpointError(f"{model_dir}: model directory not found")
        check_decoder_only(load_model_config(model_dir), "generate")
        device = resolve_device(device)
        return cls(load_model(model_dir, device), Tokenizer.load(model_dir), device)

    def encode(self, prompts: Sequence[str]) -> list[list[int]]:
        """BOS + the ids of each prompt; a one-line DataError if one leaves no position free."""
        rows = [[self.config.bos_id, *self.tokenizer.encode(p, side="tgt")] for p in prompts]
        for i, row in enumerate(rows):
            if len(row) >= self.config.max_positions:
                raise DataError(f"prompt {i + 1}: {len(row) - 1} tokens leave no room to generate within "
                                f"model.max_positions={self.config.max_positions}")
        return rows

    def generate(self, prompts: Sequence[str], gen: GenerationConfig = GenerationConfig()) -> list[str]:
        """Each prompt followed by its continuation, as text, in the order given."""
        rows = self.encode(prompts)
        generator = None
        if gen.seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(gen.seed)
        new: list[list[int]] = [[] for _ in rows]
        for batch in _same_length_batches([len(r) for r in rows], gen.batch_size):
            ids = torch.tensor([rows[i] for i in batch], device=self.device)  # (B, P)
            for i, out in zip(batch, generate_ids(self.model, ids, gen, generator)):
                new[i] = out
        return [self.tokenizer.decode(row[1:] + out, side="tgt") for row, out in zip(rows, new)]


def _same_length_batches(lengths: list[int], size: int) -> list[list[int]]:
    """Indices grouped by length (shortest first), at most ``size`` per group, in input order within."""
    groups: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        groups.setdefault(n, []).append(i)
    return [g[k:k + size] for n in sorted(groups) for g in (groups[n],) for k in range(0, len(g), size)]
