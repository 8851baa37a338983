"""The one place that decides which search runs: :class:`SearchSpec`.

A spec is a plain frozen value (worker processes are sent it,
:class:`~transduce.inference.pool.TranslatorPool`); :meth:`SearchSpec.run` picks, in this
order, speculative decoding (a draft model given), sampling (``temperature`` > 0), the static
search (CUDA graphs, or a compiled step on the CPU; by default on CUDA, and for greedy search on
a model marked by ``runtime.compile``, when it can run), greedy search (``beam`` 1) or beam
search. The algorithms never choose among themselves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ...config import DecodeConfig
from ...errors import ConfigError
from ..speed import compiles_step
from .beam import beam_search
from .common import AttentionChoice, SearchOutput, StepHook, max_lengths
from .constraints import ConstraintBeams, check_fits
from .greedy import greedy_search
from .sampling import filter_logits, sample
from .speculative import Speculation, speculative_search
from .static_shapes import static_search, unsupported

if TYPE_CHECKING:
    from .shortlist import Shortlist


@dataclass(frozen=True)
class SearchSpec:
    """The settings of one search, runnable on any batch of source ids.

    ``decode.beam`` 1 is greedy search; ``temperature`` > 0 means sampling (``beam``,
    ``lenpen``, ``nbest`` and ``stop`` unused; 0 is greedy, as in
    :class:`~transduce.config.GenerationConfig`). ``static``: run the static-shape search
    (:mod:`.static_shapes`; True), never (False), or by default (None) where it can on CUDA, and for
    greedy search on a model whose step is compiled (:func:`~transduce.inference.speed.compile_step`).
    ``scores`` False: greedy search gives only its output, scores 0 (each step the largest logit,
    no softmax over the vocabulary: :func:`~.common.best_tokens`); beam search and sampling score.
    """

    decode: DecodeConfig = DecodeConfig()
    attention: AttentionChoice | None = None
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    static: bool | None = None
    scores: bool = True

    def run(self, model: torch.nn.Module, src: Tensor, prefix: Tensor | None = None,
            speculation: Speculation | None = None, constraints: Tensor | None = None,
            shortlist: "Shortlist | None" = None, on_step: StepHook | None = None,
            inside: Tensor | None = None) -> SearchOutput:
        """Search a (B, S) batch of source ids (EOS-terminated, PAD-padded), each output
        beginning with its row of ``prefix`` ids (-1-padded), if given; with a ``speculation``,
        greedy search or sampling with its draft model proposing tokens; with ``constraints``
        (B, C, L) phrase ids (-1-padded, :func:`~.constraints.constraint_ids`), constrained beam
        search (any beam size, eager), the phrases whole words given ``inside`` (V,) bool, the
        target pieces that continue a word (:func:`~transduce.data.alignments.word_continuations`);
        with a ``shortlist`` and ``decode.shortlist``, greedy and beam search over the batch's
        target shortlist (:mod:`~transduce.inference.search.shortlist`).
        ``on_step`` is told each step's settled tokens (:data:`~.common.StepHook`; streaming: eager
        greedy, beam or speculative search)."""
        if on_step is not None and (self.static or (self.temperature and speculation is None)):
            raise ConfigError("stream: streams greedy, beam and speculative search, eagerly; not sampling or "
                              "static=True")
        if constraints is not None:
            return self._constrained(model, src, prefix, speculation, ConstraintBeams.start(constraints, inside),
                                     on_step)
        if speculation is not None:
            if prefix is not None:
                raise ConfigError("prefix: forced prefixes work without a draft model")
            return self._speculative(model, src, speculation, on_step)
        if self.temperature:
            if prefix is not None:
                raise ConfigError("prefix: forced prefixes work with greedy and beam search, not sampling")
            return sample(model, src, self.temperature, self.top_k, self.top_p, self.seed, self.decode, self.attention)
        vocab = shortlist.vocab(model, src) if shortlist is not None and self.decode.shortlist else None
        if prefix is None and on_step is None and vocab is None and self.uses_static(model, src):
            return static_search(model, src, self.decode, greedy=self.decode.beam == 1, scored=self.scores)
        if self.decode.beam == 1:
            return greedy_search(model, src, self.decode, self.attention, prefix=prefix, vocab=vocab, on_step=on_step,
                                 scored=self.scores)
        return beam_search(model, src, self.decode, self.attention, prefix=prefix, vocab=vocab, on_step=on_step)

    def uses_static(self, model: torch.nn.Module, src: Tensor) -> bool:
        """Whether the static search runs: as ``static`` says (a ConfigError if it cannot), or by
        default where it can, on CUDA and (greedy) on a model whose step is compiled."""
        if self.static is False:
            return False
        why_not = unsupported(model, self.attention)
        if self.static is None:
            # (compiled: greedy only; the compiled beam search measured no faster than the eager one)
            on = src.device.type == "cuda" or (compiles_step(model) and self.decode.beam == 1)
            return on and why_not is None
        if why_not is not None:
            raise ConfigError(f"static: {why_not}")
        return True

    def _constrained(self, model: torch.nn.Module, src: Tensor, prefix: Tensor | None,
                     speculation: Speculation | None, constraints: ConstraintBeams,
                     on_step: StepHook | None) -> SearchOutput:
        if speculation is not None or self.temperature:
            raise ConfigError("constraints: constrained decoding is beam search; drop the draft model and sampling")
        if self.static:
            raise ConfigError("static: constrained decoding runs eagerly; use static=False")
        check_fits(constraints.phrases, max_lengths(src, model.config, self.decode.max_len_a, self.decode.max_len_b))
        return beam_search(model, src, self.decode, self.attention, prefix, constraints, on_step=on_step)

    def _speculative(self, model: torch.nn.Module, src: Tensor, speculation: Speculation,
                     on_step: StepHook | None) -> SearchOutput:
        check_speculative(self.decode, self.attention)
        if not self.temperature:
            return speculative_search(model, src, speculation, self.decode, on_step=on_step)
        generator = None if self.seed is None else torch.Generator(device=src.device).manual_seed(self.seed)

        def filtered(logp: Tensor) -> Tensor:
            return filter_logits(logp, self.temperature, self.top_k, self.top_p)

        return speculative_search(model, src, speculation, self.decode, filtered, generator, on_step)


def check_speculative(decode: DecodeConfig, attention: AttentionChoice | None = None) -> None:
    """A one-line ConfigError for settings speculative decoding does not do (beam search, attention)."""
    if decode.beam != 1:
        raise ConfigError(f"decode.beam: speculative decoding is greedy (or sampling); got beam {decode.beam} "
                          "(use beam 1)")
    if attention is not None:
        raise ConfigError("attention: speculative decoding records no attention; decode without a draft model")
    if decode.no_repeat_ngram_size or decode.repetition_penalty != 1.0:
        raise ConfigError("decode.no_repeat_ngram_size/repetition_penalty: speculative decoding does not apply the "
                          "repetition controls; decode without a draft model")
