"""Greedy search and the left-to-right loop it shares with sampling (:mod:`.sampling`).

Conventions, legend and output: :mod:`.common`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from ...config import DecodeConfig
from ..speed import new_cache, prepared
from .common import (AttentionChoice, BatchVocab, SearchOutput, Seq2Seq, StepHook, best_tokens, cross_attention_row,
                     forced_tokens, max_lengths)
from .repetition import Repetition


# Choose the next token from the decoder's output states (N, D) at a step (the second
# argument), each row's forced token or -1 (the third, or None for no forcing), under the
# repetition controls over each row's output so far (the fourth, or None): returns the ids
# (N,) long and their log-probabilities (N,).
TokenChooser = Callable[[Tensor, int, Tensor | None, Repetition | None], tuple[Tensor, Tensor]]


@dataclass
class _Rows:
    """Per-row state of the left-to-right loop; rows are dropped as they finish."""

    ids: Tensor        # (N,) which sentence of the batch each active row is
    last: Tensor       # (N, 1) the token fed to the next step
    prefix: Tensor     # (N, t + 1) BOS + tokens so far (read by the uncached path and the repetition controls)
    limit: Tensor      # (N,) max_len of each row


@torch.no_grad()  # search never needs gradients (and the pooled cache forbids them)
def sequential_search(model: Seq2Seq, src: Tensor, choose: TokenChooser, decode: DecodeConfig = DecodeConfig(),
                      attention: AttentionChoice | None = None, use_cache: bool = True,
                      prefix: Tensor | None = None, on_step: StepHook | None = None) -> SearchOutput:
    """Extend one hypothesis per sentence a token at a time (greedy search and sampling).

    ``choose`` sees the decoder's output states (``decode(..., project=False)``) and does the
    output projection itself, so greedy search can score them in blocks (:func:`best_tokens`).

    Each step decodes only the newest token against the KV cache (``use_cache=False`` re-runs
    the whole prefix, for testing), so its cost does not grow with the prefix. Finished rows
    leave the batch. ``decode`` gives the length limits; ``attention`` says which
    cross-attention to record (None: none); ``prefix`` (B, L) ids, -1-padded, are each
    sentence's forced first tokens; ``on_step`` is told each step's tokens, all settled.

    Shape: src (B, S) -> SearchOutput with K = 1.
    """
    with prepared(model):
        return _sequential_search(model, src, choose, decode, attention, use_cache, prefix, on_step)


def _sequential_search(model: Seq2Seq, src: Tensor, choose: TokenChooser, decode: DecodeConfig,
                       attention: AttentionChoice | None, use_cache: bool, prefix: Tensor | None,
                       on_step: StepHook | None) -> SearchOutput:
    cfg, device = model.config, src.device
    need_attention = attention is not None
    b = src.shape[0]
    limit = max_lengths(src, cfg, decode.max_len_a, decode.max_len_b)    # (B,)
    t_cap = int(limit.max())
    out_tokens = torch.full((b, t_cap), cfg.pad_id, dtype=torch.long, device=device)
    out_lengths = torch.zeros(b, dtype=torch.long, device=device)
    out_logp = torch.zeros(b, dtype=torch.float32, device=device)
    out_attn = torch.zeros(b, t_cap, src.shape[1], device=device) if need_attention else None
    enc = model.encode(src)
    cache = new_cache(model) if use_cache else None
    # BOS + the tokens so far, kept only for what reads it (the uncached path, the repetition
    # controls, streaming); otherwise each row's last token is all a step needs.
    history = not use_cache or on_step is not None or Repetition.of(decode, src[:, :0]) is not None
    bos = torch.full((b, 1), cfg.bos_id, dtype=torch.long, device=device)
    rows = _Rows(torch.arange(b, device=device), bos, bos, limit)
    for step in range(t_cap):
        out = model.decode(rows.last if use_cache else rows.prefix, enc, cache, need_weights=need_attention,
                           project=False)
        repeat = Repetition.of(decode, rows.prefix[:, 1:])
        token, token_logp = choose(out.states[:, -1], step, forced_tokens(prefix, rows.ids, step), repeat)  # (N,), (N,)
        out_tokens[:, step].index_copy_(0, rows.ids, token)
        out_logp.index_add_(0, rows.ids, token_logp)
        if need_attention:
            out_attn[rows.ids, step] = cross_attention_row(out.cross_attentions, attention).float()
        done = (token == cfg.eos_id) | (rows.limit <= step + 1)           # (N,)
        last = token[:, None]
        rows = _Rows(rows.ids, last, torch.cat([rows.prefix, last], dim=1) if history else last, rows.limit)
        if on_step is not None:
            on_step(rows.ids, rows.prefix[:, 1:], torch.full_like(rows.ids, step + 1))
        finished = int(done.sum())  # the step's one read of a device value
        if finished == 0:
            continue
        out_lengths[rows.ids[done]] = step + 1
        if finished == done.shape[0]:
            break
        keep = (~done).nonzero().squeeze(1)                               # (N',)
        rows = _Rows(rows.ids[keep], rows.last[keep], rows.prefix[keep], rows.limit[keep])
        enc = enc.index_select(keep)
        cache = cache.reorder(keep) if cache is not None else None
    return SearchOutput(out_tokens[:, None], out_lengths[:, None], out_logp[:, None].clone(),
                        out_logp[:, None], None if out_attn is None else out_attn[:, None])


def greedy_search(model: Seq2Seq, src: Tensor, decode: DecodeConfig = DecodeConfig(),
                  attention: AttentionChoice | None = None, use_cache: bool = True,
                  prefix: Tensor | None = None, vocab: BatchVocab | None = None,
                  on_step: StepHook | None = None, scored: bool = True) -> SearchOutput:
    """Pick the most probable token at each step (beam search with a beam of one).

    Args:
        model: an encoder-decoder with ``encode``/``decode``/``new_cache`` (see :class:`Seq2Seq`).
        src: (B, S) source ids, each row ending in EOS, right-padded with PAD.
        decode: the settings used here: ``max_len_a``/``max_len_b`` (output limit
            a * source_len + b tokens, EOS counted), ``min_len`` (no EOS before it) and the
            repetition controls (:mod:`.repetition`).
        attention: also return each output token's cross-attention of this layer and head.
        use_cache: decode incrementally with the KV cache (False re-runs the prefix).
        prefix: (B, L) target ids each output must begin with, -1-padded
            (:func:`~transduce.inference.search.common.prefix_ids`).
        vocab: the batch's target shortlist, or None for the full vocabulary.
        on_step: told each step's tokens (:data:`~.common.StepHook`), for streaming.
        scored: False when only the output is wanted: each step takes the largest logit, no
            softmax over the vocabulary (:func:`~.common.best_tokens`), and scores are 0.

    Returns:
        :class:`SearchOutput` with K = 1; scores are summed log-probabilities (0 unscored).
    """
    cfg = model.config

    def most_probable(states: Tensor, step: int, forced: Tensor | None, repeat: Repetition | None
                      ) -> tuple[Tensor, Tensor]:
        logp, token = best_tokens(model, states, cfg, step, decode.min_len, 1, forced, repeat, vocab,
                                  scored=scored)  # (N, 1) each
        return token.squeeze(1), logp.squeeze(1)

    return sequential_search(model, src, most_probable, decode, attention, use_cache, prefix, on_step)

