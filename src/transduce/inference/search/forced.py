"""Forced decoding: the score of a given output, as the searches would score it.

One decoder pass over BOS + the target (teacher forcing, no cache), then each position's
log-probabilities through :func:`~transduce.inference.search.common.step_log_probs` with the
search's own rules (``min_len``, the repetition controls), so the total is the ``log_probs`` a
search reports for that output and the ranking score is the same ``log_prob / lp(length)``
beam search uses (:func:`~transduce.inference.search.common.length_penalty`; length counts EOS).

Legend: B pairs, S source length, T target length (EOS counted), D d_model, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ...config import DecodeConfig
from ..speed import prepared
from .common import AttentionChoice, Seq2Seq, length_penalty, step_log_probs
from .repetition import Repetition


@dataclass
class ForcedOutput:
    """Scores of given outputs.

    Attributes:
        token_log_probs: (B, T) each target token's log-probability, 0 after the end.
        log_probs: (B,) their sum, log P(Y|X) under the search's rules.
        scores: (B,) ``log_probs`` divided by the GNMT length penalty of ``decode.lenpen``, as
            beam search ranks its hypotheses.
        lengths: (B,) tokens per target (EOS counted).
        cross_attention: (B, T, S) the cross-attention of the chosen layer (one head, or the
            mean of heads) when asked for, else None; row t is what predicts ``tgt[:, t]``.
    """

    token_log_probs: Tensor
    log_probs: Tensor
    scores: Tensor
    lengths: Tensor
    cross_attention: Tensor | None = None

    def cpu(self) -> "ForcedOutput":
        """The same output on the CPU, its scores and attention in fp32."""
        cross = None if self.cross_attention is None else self.cross_attention.float().cpu()
        return ForcedOutput(self.token_log_probs.float().cpu(), self.log_probs.float().cpu(),
                            self.scores.float().cpu(), self.lengths.cpu(), cross)


@dataclass(frozen=True)
class ForceSpec:
    """Forced decoding as a job shaped like a :class:`~transduce.inference.search.SearchSpec`'s,
    so that whatever runs searches (a :class:`~transduce.inference.Translator`, a decoding
    worker of a :class:`~transduce.inference.TranslatorPool`) runs it too: the batch's targets
    travel where a search's forced prefixes do."""

    decode: DecodeConfig = DecodeConfig()
    attention: AttentionChoice | None = None
    temperature: float = 0.0  # not sampling (what a pool's deadline estimate reads)

    def run(self, model: Seq2Seq, src: Tensor, tgt: Tensor | None = None, speculation: object = None,
            constraints: Tensor | None = None, inside: Tensor | None = None) -> ForcedOutput:
        """:func:`force_decode` of ``src`` (B, S) and ``tgt`` (B, T) on ``model`` (CPU output);
        the search's other arguments are unused."""
        if tgt is None:
            raise ValueError("ForceSpec.run: needs the targets")
        return force_decode(model, src, tgt, self.decode, self.attention).cpu()


@torch.no_grad()
def force_decode(model: Seq2Seq, src: Tensor, tgt: Tensor, decode: DecodeConfig = DecodeConfig(),
                 attention: AttentionChoice | None = None) -> ForcedOutput:
    """Score each row of ``tgt`` as the output for the same row of ``src``.

    Args:
        model: an encoder-decoder (see :class:`~transduce.inference.search.common.Seq2Seq`).
        src: (B, S) source ids, each row ending in EOS, right-padded with PAD.
        tgt: (B, T) target ids (EOS-terminated, or not: an output cut at the length limit),
            right-padded with PAD.
        decode: ``min_len``, the repetition controls and ``lenpen``, as the search used them.
        attention: also return this layer's (and head's, or the heads' mean) cross-attention
            (the explicit softmax path, ``need_weights``), e.g. for word alignments.

    Returns:
        :class:`ForcedOutput`.
    """
    cfg = model.config
    b, t = tgt.shape
    real = tgt != cfg.pad_id                                              # (B, T)
    with prepared(model):
        enc = model.encode(src)
        bos = torch.full((b, 1), cfg.bos_id, dtype=tgt.dtype, device=tgt.device)
        dec = model.decode(torch.cat([bos, tgt[:, :-1]], dim=1), enc, None, need_weights=attention is not None,
                           project=False)
        states = dec.states                                               # (B, T, D)
        token_logp = torch.zeros(b, t, device=tgt.device)
        for step in range(t):
            logp = step_log_probs(model.output_proj(states[:, step]), cfg, step, decode.min_len,
                                  repeat=Repetition.of(decode, tgt, step))   # (B, V)
            token_logp[:, step] = logp.gather(1, tgt[:, step:step + 1].clamp(min=0)).squeeze(1)
    token_logp = token_logp.masked_fill(~real, 0.0)
    lengths = real.sum(dim=1)
    log_probs = token_logp.sum(dim=1)
    cross = None
    if attention is not None:
        w = dec.cross_attentions[attention.layer]                         # (B, H, T, S)
        cross = w.mean(dim=1) if attention.head is None else w[:, attention.head]  # (B, T, S)
    return ForcedOutput(token_logp, log_probs, log_probs / length_penalty(lengths.float(), decode.lenpen), lengths,
                        cross)
