"""Text generation with a decoder-only language model (``transduce generate``, :class:`Generator`).

A prompt becomes its ids, after BOS where the tokenizer says the model reads BOS first
(``add_bos_token``: our own models; not an imported GPT-2, prompted as transformers prompts it);
the model reads it at once into a :class:`KVCache`, then adds
one token per step (greedy when ``temperature`` is 0, else sampled after temperature, top-k and
top-p filtering, :func:`~transduce.inference.search.sampling.filter_logits`) until EOS,
``max_new_tokens`` or the model's ``max_positions``. Prompts of the same token length share a
batch, so no row needs padding or shifted positions.
"""

from __future__ import annotations

import os
from typing import Sequence

import torch

from ..config import GenerationConfig, ModelConfig, Runtime
from ..data.tokenizer import load_tokenizer
from ..device import autocast_context, resolve_device
from ..errors import ConfigError, DataError
from ..model.io import load_model_config
from .placement import apply_threads, load_model_dir, model_dirs, prepared_for
from .search.lm import generate_ids
from .speed import restore


def check_decoder_only(config: ModelConfig, what: str) -> None:
    """One-line ConfigError unless ``config`` is a decoder-only language model."""
    if not config.family.generates:
        raise ConfigError(f"{what}: needs a decoder_only model (a language model); this one is {config.arch}")


class Generator:
    """A language model and its tokenizer, continuing lists of prompts.

    Args:
        model: an eval-mode :class:`~transduce.model.DecoderOnlyLM`.
        tokenizer: its :class:`~transduce.data.tokenizer.Tokenizer` (the target side is the LM's).
        runtime: device, precision and int8 (:class:`~transduce.inference.runtime.Runtime`).

    The model is prepared for decoding in place, as a :class:`~transduce.inference.Translator`
    prepares its own (:func:`~transduce.inference.speed.prepare_for_decoding`: fused projections,
    on CPU oneDNN linear layers); :meth:`close` (or leaving a ``with Generator(...)`` block) hands
    it back as it came.

    Examples:
        >>> gen = Generator.load("runs/gpt_toy/model")                       # doctest: +SKIP
        >>> gen.generate(["der Hund"], GenerationConfig(temperature=0))       # doctest: +SKIP
    """

    def __init__(self, model: torch.nn.Module, tokenizer, runtime: Runtime = Runtime()):
        check_decoder_only(model.config, "generate")
        self.device = resolve_device(runtime.device, "runtime.device")
        autocast_context(self.device, runtime.precision, "runtime.precision")  # a bad precision fails here
        if runtime.int8 and self.device.type != "cpu":
            raise ConfigError(f"runtime.int8: dynamic int8 quantisation runs on the CPU; got device {self.device}")
        self.runtime = runtime
        self.model = prepared_for(model, self.device, runtime)
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
    def load(cls, model_dir: str | os.PathLike, runtime: Runtime = Runtime()) -> "Generator":
        """The model and tokenizer of a model directory; a one-line error for another arch."""
        model_dir = model_dirs(model_dir)[0]
        check_decoder_only(load_model_config(model_dir), "generate")
        apply_threads(runtime)
        device = resolve_device(runtime.device, "runtime.device")
        return cls(load_model_dir(model_dir, device), load_tokenizer(model_dir), runtime)

    def encode(self, prompts: Sequence[str]) -> list[list[int]]:
        """Each prompt as the model reads it: BOS + its ids where the tokenizer's ``add_bos_token``
        is true (our models, trained so), else its ids alone, as ``AutoTokenizer`` gives them to
        an imported GPT-2. An empty prompt is BOS alone either way: a continuation needs a token
        to follow, and transformers' ``generate`` given no input starts from BOS too. A one-line
        DataError if a prompt leaves no position free."""
        rows = []
        for i, prompt in enumerate(prompts):
            ids = self.tokenizer.encode(prompt, side="tgt")
            row = [self.config.bos_id, *ids] if self.tokenizer.add_bos_token or not ids else ids
            if len(row) >= self.config.max_positions:
                raise DataError(f"prompt {i + 1}: {len(ids)} tokens leave no room to generate within "
                                f"model.max_positions={self.config.max_positions}")
            rows.append(row)
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
            with autocast_context(self.device, self.runtime.precision):
                out = generate_ids(self.model, ids, gen, generator)
            for i, row in zip(batch, out):
                new[i] = row
        bos = self.config.bos_id
        prompt_ids = [row[1:] if row[0] == bos else row for row in rows]  # without the BOS encode put first
        return [self.tokenizer.decode(ids + out, side="tgt") for ids, out in zip(prompt_ids, new)]


def _same_length_batches(lengths: list[int], size: int) -> list[list[int]]:
    """Indices grouped by length (shortest first), at most ``size`` per group, in input order within."""
    groups: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        groups.setdefault(n, []).append(i)
    return [g[k:k + size] for n in sorted(groups) for g in (groups[n],) for k in range(0, len(g), size)]
