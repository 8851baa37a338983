"""Beam search (Sec. 6.1: "beam search with a beam size of 4 and length penalty alpha = 0.6").

Batched over sentences and beams: one decoder call per step for all B*K hypotheses, one
top-k over each sentence's K*V extensions, no Python loop over sentences or beams. The KV
cache makes each step cost the same whatever the prefix length; cross-attention keys/values
are projected once (first step), kept once per sentence and shared by its beams, and the
self-attention cache is reordered by the chosen parent beams.

The step follows fairseq: take the best 2K extensions of each sentence; those of the top K
that end (EOS, or the length limit) become finished hypotheses scored with the GNMT length
penalty; the best K that do not end stay alive. Done sentences leave the batch. When a
sentence is done is the ``stop`` rule:

- ``"k_finished"`` (default; fairseq, HF ``early_stopping=True``): once K hypotheses have
  finished. Cheap, but an alive beam that would have scored better may be cut off.
- ``"best_finished"`` (CTranslate2): once the best extension of some step ended (and at least
  ``nbest`` hypotheses have finished). With ``lenpen=0`` this is exact for the beam: scores only
  fall as hypotheses grow, so nothing still alive can beat an ending that was the best of its
  step. CTranslate2 applies it when its length penalty is 0 (it uses "k_finished" otherwise),
  so with ``lenpen=0`` both searches return the same hypotheses.

Legend: B active sentences, K beam, N = B*K rows, t tokens so far, S source, V vocabulary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from ...config import DecodeConfig
from ..speed import new_cache, prepared
from .common import (AttentionChoice, BatchVocab, BlockHook, Seq2Seq, SearchOutput, StepHook, best_tokens,
                     cross_attention_row, forced_tokens, length_penalty, max_lengths)
from .repetition import Repetition

if TYPE_CHECKING:  # constraints.py builds on this module's Beams and Candidates
    from .constraints import ConstraintBeams


@dataclass
class Beams:
    """The alive hypotheses of the active sentences."""

    ids: Tensor              # (B,) index of each active sentence in the input batch
    tokens: Tensor           # (B, k, t + 1) BOS + tokens so far; k = 1 before the first step
    scores: Tensor           # (B, k) summed log-probs
    limit: Tensor            # (B,) max output length of each sentence
    attention: Tensor | None  # (B, k, t, S) cross-attention of each token so far


@dataclass
class Candidates:
    """The best 2K one-token extensions of each sentence, best first."""

    scores: Tensor    # (B, 2K) summed log-probs
    parent: Tensor    # (B, 2K) which alive beam each extends
    token: Tensor     # (B, 2K) the new token
    ends: Tensor      # (B, 2K) bool: becomes a finished hypothesis


@dataclass
class Finished:
    """The best K finished hypotheses of every input sentence (-inf score = empty slot)."""

    tokens: Tensor           # (B0, K, T) PAD-padded
    lengths: Tensor          # (B0, K)
    scores: Tensor           # (B0, K) length-normalised
    log_probs: Tensor        # (B0, K)
    count: Tensor            # (B0,) how many hypotheses have finished so far
    best_ended: Tensor       # (B0,) bool: the best extension of some step was an ending
    attention: Tensor | None  # (B0, K, T, S)


def pick(x: Tensor, index: Tensor) -> Tensor:
    """Gather along dim 1 with trailing dims carried. x (B, k, *E), index (B, m) -> (B, m, *E)."""
    return x.gather(1, index.view(*index.shape, *([1] * (x.dim() - 2))).expand(-1, -1, *x.shape[2:]))


def extend(history: Tensor, parent: Tensor, new: Tensor) -> Tensor:
    """Append ``new`` to the histories of the chosen parents.

    Shape: history (B, k, t, *E), parent (B, m), new (B, m, *E) -> (B, m, t + 1, *E).
    """
    return torch.cat([pick(history, parent), new.unsqueeze(2)], dim=2)


def candidates(row_logp: Tensor, row_token: Tensor, beams: Beams, beam: int, step: int,
               eos_id: int) -> Candidates:
    """Top 2K extensions over the (beam, token) pairs of each sentence.

    Two stages: each row's best w = min(2K, V) tokens (``row_logp``, ``row_token``, from
    :func:`~transduce.inference.search.common.best_tokens`; the sentence's best 2K extensions can only
    come from those), then the best 2K of the k * w survivors.

    Shape: row_logp, row_token (B*k, w) -> Candidates of width min(2K, k*w).
    """
    b, k = beams.scores.shape
    per_row = row_logp.shape[1]
    total = (beams.scores.view(-1, 1) + row_logp).view(b, k * per_row)   # (B, k*w)
    scores, flat = total.topk(min(2 * beam, k * per_row), dim=1)          # (B, 2K)
    parent, token = flat // per_row, row_token.view(b, -1).gather(1, flat)
    ends = ((token == eos_id) | (beams.limit.unsqueeze(1) <= step + 1)) & (scores > -math.inf)
    ends[:, beam:] = False  # only the top K may finish, so finished ones beat the alive ones
    return Candidates(scores, parent, token, ends)


def _merge(old: Tensor, new: Tensor, best: Tensor) -> Tensor:
    """Pick ``best`` (B, K) along dim 1 of ``cat([old, new], 1)``; trailing dims follow."""
    return pick(torch.cat([old, new], dim=1), best)


def finish(fin: Finished, beams: Beams, cand: Candidates, step: int, lenpen: float, pad_id: int,
           attn: Tensor | None) -> None:
    """Merge the ending candidates into ``fin``, keeping each sentence's best K (in place).

    Finished hypotheses are ranked by log P(Y|X) / lp(Y) (:func:`length_penalty`); ``attn``
    (B, k, S) is this step's cross-attention of each alive beam.
    """
    t_cap = fin.tokens.shape[2]
    m = min(fin.scores.shape[1], cand.scores.shape[1])
    parent = cand.parent[:, :m]                                           # (B, m)
    tokens = extend(beams.tokens, parent, cand.token[:, :m])[:, :, 1:]    # (B, m, t + 1)
    tokens = F.pad(tokens, (0, t_cap - tokens.shape[2]), value=pad_id)    # (B, m, T)
    a = None
    if fin.attention is not None:
        a = F.pad(extend(beams.attention, parent, pick(attn, parent)), (0, 0, 0, t_cap - step - 1))  # (B, m, T, S)
    store(fin, beams.ids, cand, length_penalty(step + 1, lenpen), torch.full_like(parent, step + 1), tokens, a)


def store(fin: Finished, ids: Tensor | slice, cand: Candidates, lp: Tensor | float, lengths: Tensor, tokens: Tensor,
          attention: Tensor | None = None) -> None:
    """Merge the ending ones of the first m candidates (their ``lengths`` (B, m), PAD-padded
    ``tokens`` (B, m, T), ``attention`` (B, m, T, S)) into rows ``ids`` (B,) of ``fin`` (or all
    rows: ``slice(None)``), scored by log-prob / ``lp``, keeping each sentence's best K (in place)."""
    m = lengths.shape[1]
    ends = cand.ends[:, :m]                                               # (B, m)
    new_logp = torch.where(ends, cand.scores[:, :m], -math.inf)
    new_scores = new_logp / lp
    best = torch.cat([fin.scores[ids], new_scores], dim=1).topk(fin.scores.shape[1], dim=1).indices  # (B, K)
    fin.scores[ids] = _merge(fin.scores[ids], new_scores, best)
    fin.log_probs[ids] = _merge(fin.log_probs[ids], new_logp, best)
    fin.lengths[ids] = _merge(fin.lengths[ids], lengths, best)
    fin.tokens[ids] = _merge(fin.tokens[ids], tokens, best)
    fin.count[ids] += ends.sum(dim=1)
    fin.best_ended[ids] |= ends[:, 0]
    if attention is not None:
        fin.attention[ids] = _merge(fin.attention[ids], attention, best)


def survivors(cand: Candidates, beam: int) -> tuple[Tensor, Tensor, Tensor]:
    """The best K candidates that do not end, in order: their scores (-inf where fewer than K
    do not end), parent beams and tokens. -> three (B, K)."""
    width = cand.scores.shape[1]
    order = torch.arange(width, device=cand.scores.device)
    key = cand.ends.long() * width + order                                # ending ones sort last
    pick = key.topk(beam, dim=1, largest=False).indices                   # (B, K), ascending
    scores = cand.scores.gather(1, pick).masked_fill(cand.ends.gather(1, pick), -math.inf)
    return scores, cand.parent.gather(1, pick), cand.token.gather(1, pick)


def advance(beams: Beams, cand: Candidates, beam: int, attn: Tensor | None) -> tuple[Beams, Tensor]:
    """Keep the best K candidates that do not end; returns the new beams and, for the cache,
    the decoder row (B*k numbering) each new beam continues. -> Beams, rows (B*K,)."""
    scores, parent, token = survivors(cand, beam)                         # (B, K) each
    b, k = beams.scores.shape
    rows = (parent + torch.arange(b, device=parent.device).unsqueeze(1) * k).view(-1)
    attention = None
    if attn is not None:
        attention = extend(beams.attention, parent, pick(attn, parent))  # (B, K, t + 1, S)
    return Beams(beams.ids, extend(beams.tokens, parent, token), scores, beams.limit, attention), rows


def settled(beams: Beams, fin: Finished) -> tuple[Tensor, Tensor]:
    """What no later step can change: each active sentence's tokens that every hypothesis that
    may still be returned begins with, i.e. the prefix its live beams (score > -inf) and its
    finished hypotheses share (any later finished one extends a live beam). -> tokens (B, t) of
    the first beam, settled lengths (B,)."""
    alive = beams.tokens[:, :, 1:]                                        # (B, k, t)
    first = alive[:, 0]                                                   # (B, t)
    t = first.shape[1]
    agree = (alive == first[:, None]) | (beams.scores == -math.inf)[:, :, None]  # (B, k, t)
    done = fin.tokens[beams.ids, :, :t]                                   # (B, K, t); PAD past the end
    agree_done = (done == first[:, None]) | (fin.scores[beams.ids] == -math.inf)[:, :, None]
    common = agree.all(dim=1) & agree_done.all(dim=1)                     # (B, t)
    lengths = common.long().cumprod(dim=1).sum(dim=1)                     # (B,)
    return first, torch.where(beams.scores[:, 0] > -math.inf, lengths, 0)


def drop_done(beams: Beams, rows: Tensor, done: Tensor) -> tuple[Beams, Tensor, Tensor]:
    """Remove the sentences that are ``done`` (B,) bool and their rows of ``rows`` (B*K,).
    -> the kept beams, their rows (B'*K,), and which sentences were kept (B',)."""
    keep = (~done).nonzero().squeeze(1)                                   # (B',)
    attention = beams.attention[keep] if beams.attention is not None else None
    kept = Beams(beams.ids[keep], beams.tokens[keep], beams.scores[keep], beams.limit[keep], attention)
    return kept, rows.view(done.shape[0], -1)[keep].reshape(-1), keep


def start(src: Tensor, beam: int, config: object, max_len_a: float, max_len_b: int,
          need_attention: bool) -> tuple[Beams, Finished]:
    """One alive hypothesis (BOS) per sentence, and an empty store of finished ones."""
    b, s = src.shape
    device = src.device
    bos_id, pad_id = config.bos_id, config.pad_id
    limit = max_lengths(src, config, max_len_a, max_len_b)               # (B,)
    t_cap = int(limit.max())
    beams = Beams(torch.arange(b, device=device), torch.full((b, 1, 1), bos_id, device=device),
                  torch.zeros(b, 1, device=device), limit,
                  torch.zeros(b, 1, 0, s, device=device) if need_attention else None)
    fin = Finished(torch.full((b, beam, t_cap), pad_id, device=device),
                   torch.zeros(b, beam, dtype=torch.long, device=device),
                   torch.full((b, beam), -math.inf, device=device),
                   torch.full((b, beam), -math.inf, device=device),
                   torch.zeros(b, dtype=torch.long, device=device),
                   torch.zeros(b, dtype=torch.bool, device=device),
                   torch.zeros(b, beam, t_cap, s, device=device) if need_attention else None)
    return beams, fin


@torch.no_grad()  # search never needs gradients (and the pooled cache forbids them)
def beam_search(model: Seq2Seq, src: Tensor, decode: DecodeConfig = DecodeConfig(),
                attention: AttentionChoice | None = None, prefix: Tensor | None = None,
                constraints: ConstraintBeams | None = None, vocab: BatchVocab | None = None,
                on_step: StepHook | None = None) -> SearchOutput:
    """Beam search over a batch of sentences at once.

    Args:
        model: an encoder-decoder with ``encode``/``decode``/``new_cache`` (see :class:`Seq2Seq`).
        src: (B, S) source ids, each row ending in EOS, right-padded with PAD.
        decode: ``beam`` hypotheses kept per sentence (K); ``lenpen``, alpha of the GNMT length
            penalty ((5 + |Y|) / 6) ** alpha (0 disables it); output limit ``max_len_a`` *
            source_len + ``max_len_b`` tokens (EOS counted); ``nbest`` hypotheses returned per
            sentence; no EOS before ``min_len`` tokens; ``stop``, when a sentence is done
            (see the module doc); the repetition controls (:mod:`.repetition`).
        attention: also return each output token's cross-attention of this layer and head.
        prefix: (B, L) target ids each hypothesis must begin with, -1-padded
            (:func:`~transduce.inference.search.common.prefix_ids`); the rest is searched.
        constraints: each sentence's target phrases that must appear, tracked per hypothesis
            (:meth:`~transduce.inference.search.constraints.ConstraintBeams.start`): dynamic beam
            allocation (:mod:`.constraints`).
        vocab: the batch's target shortlist (unused with ``constraints``), or None for the full vocabulary.
        on_step: told each step's settled prefix (:func:`settled`), for streaming.

    Returns:
        :class:`SearchOutput` with ``nbest`` hypotheses per sentence, best first.
    """
    with prepared(model):
        return _beam_search(model, src, decode, attention, prefix, constraints, vocab, on_step)


def _beam_search(model: Seq2Seq, src: Tensor, decode: DecodeConfig, attention: AttentionChoice | None,
                 prefix: Tensor | None, cons: ConstraintBeams | None, vocab: BatchVocab | None,
                 on_step: StepHook | None) -> SearchOutput:
    cfg, beam, need_attention = model.config, decode.beam, attention is not None
    beams, fin = start(src, beam, cfg, decode.max_len_a, decode.max_len_b, need_attention)
    enc, cache = model.encode(src), new_cache(model)
    for step in range(fin.tokens.shape[2]):
        n_rows = beams.scores.numel()
        out = model.decode(beams.tokens[:, :, -1].reshape(n_rows, 1), enc, cache, need_weights=need_attention,
                           project=False)
        states = out.states[:, -1]                                        # (N, D)
        forced = forced_tokens(prefix, beams.ids, step)                   # (B,) or None: no work without a prefix
        if forced is not None:
            forced = forced.repeat_interleave(beams.scores.shape[1])      # (N,) each beam its sentence's
        repeat = Repetition.of(decode, beams.tokens.view(n_rows, -1)[:, 1:])  # each beam's output so far
        attn = None
        if need_attention:
            attn = cross_attention_row(out.cross_attentions, attention)
            attn = attn.float().view(*beams.scores.shape, -1)             # (B, k, S)
        def best(hook: BlockHook | None = None) -> tuple[Tensor, Tensor]:  # (N, w) each
            return best_tokens(model, states, cfg, step, decode.min_len, 2 * beam, forced, repeat, vocab, hook)

        if cons is None:
            cand = candidates(*best(), beams, beam, step, cfg.eos_id)
        else:  # its refusals written into the log-probs as best_tokens scores them
            cand = cons.candidates(best, beams, beam, step, cfg.eos_id, forced)
        if bool(cand.ends.any()):
            finish(fin, beams, cand, step, decode.lenpen, cfg.pad_id, attn)
        beams, rows = advance(beams, cand, beam, attn)
        if on_step is not None:
            on_step(beams.ids, *settled(beams, fin))
        if decode.stop == "k_finished":
            done = fin.count[beams.ids] >= beam                           # (B,)
        else:
            done = fin.best_ended[beams.ids] & (fin.count[beams.ids] >= decode.nbest)
        finished = int(done.sum())  # one read of a device value for both tests
        if finished == done.shape[0]:
            break
        # The encoder output and cross-attention K/V stay one row per sentence, shared by its
        # beams; they only change when sentences leave.
        keep: Tensor | bool = False
        if finished:
            beams, rows, keep = drop_done(beams, rows, done)
            enc = enc.index_select(keep)
        if cons is not None:
            cons = cons.advanced(beams, rows)
        cache = cache.reorder(rows, cross=keep)
    return best_of(fin, decode.nbest)


def best_of(fin: Finished, nbest: int) -> SearchOutput:
    """Sort each sentence's finished hypotheses by score, keep ``nbest``, trim padding."""
    order = fin.scores.argsort(dim=1, descending=True)[:, :nbest]        # (B, n)
    lengths = fin.lengths.gather(1, order)
    t = max(int(lengths.max()), 1) if lengths.numel() else 1
    tokens = pick(fin.tokens, order)[:, :, :t]
    attention = None
    if fin.attention is not None:
        attention = pick(fin.attention, order)[:, :, :t]
    return SearchOutput(tokens, lengths, fin.scores.gather(1, order), fin.log_probs.gather(1, order), attention)
