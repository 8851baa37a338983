"""Ensembles at decoding time: several models of one tokenizer, their token log-probabilities
averaged at every step of greedy and beam search (as fairseq's and Marian's ensembles).

:class:`Ensemble` is a :class:`~transduce.inference.search.common.Seq2Seq`, so every search runs on it
unchanged: ``encode`` and ``decode`` run each member with its own encoder output and KV cache;
``decode`` returns the members' output states side by side (N, D_1 + ... + D_m), and
``output_proj`` turns them into the mean of the members' log-softmaxes, which the search's own
log-softmax then renormalises:

    log p(y | x) = mean_i log p_i(y | x) - log sum_y' exp(mean_i log p_i(y' | x))

(a normalised geometric mean of the members' distributions). One member gives that member's
own search exactly; members may differ in shape, but not in vocabulary or special ids.

Examples:
    >>> tr = Translator.load_ensemble(["runs/a/model", "runs/b/model"])   # doctest: +SKIP
    >>> tr.translate(["A dog runs."], beam=4)                             # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ...errors import ConfigError
from ...model.transformer import DecoderOutput
from ..speed import new_cache
from .common import output_log_softmax


@dataclass
class EnsembleEncoderOutput:
    """Each member's encoder output."""

    members: list

    def index_select(self, index: Tensor) -> "EnsembleEncoderOutput":
        return EnsembleEncoderOutput([e.index_select(index) for e in self.members])


@dataclass
class EnsembleCache:
    """Each member's KV cache; reordered together."""

    members: list

    def reorder(self, *args, **kwargs) -> "EnsembleCache":
        return EnsembleCache([c.reorder(*args, **kwargs) for c in self.members])


class Ensemble(nn.Module):
    """Encoder-decoder models searched as one (see the module docstring).

    Args:
        models: eval-mode encoder-decoder models with the same target vocabulary size and
            special ids (the caller checks that their tokenizers are one).
    """

    def __init__(self, models: list[nn.Module]):
        super().__init__()
        if not models:
            raise ConfigError("an ensemble needs at least one model")
        first = models[0].config
        for i, m in enumerate(models[1:], start=2):
            cfg = m.config
            if not cfg.family.translates:
                raise ConfigError(f"ensemble member {i}: needs an encoder_decoder model; this one is {cfg.arch}")
            for key in ("src_vocab_size", "tgt_vocab_size", "pad_id", "bos_id", "eos_id"):
                if getattr(cfg, key) != getattr(first, key):
                    raise ConfigError(f"ensemble member {i}: model.{key}={getattr(cfg, key)}, the first model's "
                                      f"is {getattr(first, key)} (an ensemble needs one vocabulary)")
        self.members = nn.ModuleList(models)
        self.config = first
        self._widths = [m.config.d_model for m in models]

    def encode(self, src: Tensor, need_weights: bool = False) -> EnsembleEncoderOutput:
        return EnsembleEncoderOutput([m.encode(src) for m in self.members])

    def new_cache(self) -> EnsembleCache:
        return EnsembleCache([new_cache(m) for m in self.members])

    def decode(self, tgt: Tensor, enc: EnsembleEncoderOutput, cache: EnsembleCache | None = None,
               need_weights: bool = False, project: bool = True) -> DecoderOutput:
        """Every member's decoder step; states side by side, cross-attention of the first member."""
        outs = [m.decode(tgt, e, None if cache is None else c, need_weights=need_weights, project=False)
                for m, e, c in zip(self.members, enc.members, cache.members if cache is not None
                                   else [None] * len(self.members))]
        states = torch.cat([o.states for o in outs], dim=-1)             # (N, T, sum D)
        return DecoderOutput(states, self.output_proj(states) if project else None, cache,
                             outs[0].self_attentions, outs[0].cross_attentions)

    def output_proj(self, states: Tensor) -> Tensor:
        """The members' mean log-softmax over the vocabulary. (..., sum D) -> (..., V) float32."""
        parts = states.split(self._widths, dim=-1)
        logp = [output_log_softmax(m.output_proj(s).float(), m.config) for m, s in zip(self.members, parts)]
        return torch.stack(logp).mean(dim=0)

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        """Teacher-forced ensemble log-probabilities. (B, S), (B, T) -> (B, T, V)."""
        return self.decode(tgt, self.encode(src)).logits
