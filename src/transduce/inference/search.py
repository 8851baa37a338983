"""What every search shares: the output type, length limits, step log-probabilities, and the
left-to-right loop behind greedy search and sampling.

Legend: B sentences, K hypotheses per sentence (beam), N = B*K decoder rows, S source
length, T output length, V target vocabulary.

Conventions (all searches):
  * the source ``src`` (B, S) holds token ids + EOS, right-padded with PAD;
  * the decoder starts from BOS, a hypothesis ends when it emits EOS or reaches its
    length limit ``max_len = floor(max_len_a * source_len + max_len_b)`` (source_len counts
    EOS, as fairseq; the paper, Sec. 6.1, uses "input length + 50");
  * output tokens exclude BOS and include the final EOS when there is one;
  * PAD and BOS are never generated, EOS not before ``min_len`` tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Protocol

import torch
from torch import Tensor

from ..config import DecodeConfig
from .fast import new_cache, prepared


class Seq2Seq(Protocol):
    """What search needs from a model (:class:`~transduce.model.Transformer` fits)."""

    config: object  # with pad_id, bos_id, eos_id

    def encode(self, src: Tensor): ...

    def decode(self, tgt: Tensor, enc, cache=None, need_weights: bool = False, project: bool = True): ...

    def new_cache(self): ...

    # decode(...).states are what ``output_proj`` turns into logits
    output_proj: Callable[[Tensor], Tensor]


@dataclass(frozen=True)
class AttentionChoice:
    """Which cross-attention a search records for each output token: layer ``layer`` (negative
    from the top), head ``head`` or the mean over heads (None)."""

    layer: int = -1
    head: int | None = None


@dataclass
class SearchOutput:
    """The hypotheses of a batch, best first for each sentence.

    Attributes:
        tokens: (B, K, T) output ids, PAD after each hypothesis' end.
        lengths: (B, K) tokens per hypothesis (EOS counted when present).
        scores: (B, K) the ranking score: the log-probability divided by the GNMT length
            penalty for beam search, the plain log-probability otherwise.
        log_probs: (B, K) sum of the token log-probabilities under the model.
        attention: (B, K, T, S) cross-attention of each output token, or None.
    """

    tokens: Tensor
    lengths: Tensor
    scores: Tensor
    log_probs: Tensor
    attention: Tensor | None = None

    def cpu(self) -> "SearchOutput":
        """The same output with every tensor on the CPU."""
        attention = None if self.attention is None else self.attention.cpu()
        return SearchOutput(self.tokens.cpu(), self.lengths.cpu(), self.scores.cpu(), self.log_probs.cpu(), attention)

    def hypothesis(self, i: int, k: int = 0) -> list[int]:
        """Token ids of sentence ``i``'s ``k``-th best hypothesis."""
        return self.tokens[i, k, : int(self.lengths[i, k])].tolist()


def length_penalty(length: Tensor | int, alpha: float) -> Tensor | float:
    """GNMT length penalty lp(Y) = ((5 + |Y|) / 6) ** alpha (Wu et al., 2016, Eq. 14).

    Beam search ranks finished hypotheses by log P(Y|X) / lp(Y); the paper uses alpha = 0.6.
    """
    return ((5.0 + length) / 6.0) ** alpha


def max_lengths(src: Tensor, config: object, max_len_a: float, max_len_b: int) -> Tensor:
    """Per-sentence output limit floor(a * source_len + b), at least 1. (B, S) -> (B,) long.

    With learned positions the decoder has ``max_positions`` of them, which caps the limit.
    """
    src_len = (src != config.pad_id).sum(dim=1).to(torch.float64)        # (B,)
    limit = (max_len_a * src_len + max_len_b).floor().long().clamp(min=1)
    if getattr(config, "positions", None) == "learned":
        limit = limit.clamp(max=config.max_positions)
    return limit


def step_log_probs(logits: Tensor, config: object, step: int | Tensor, min_len: int,
                   forced: Tensor | None = None) -> Tensor:
    """Log-softmax over the vocabulary, then forbid PAD, BOS and (before ``min_len``) EOS; rows
    with a ``forced`` token (N,) (-1: none) may only take that one (prefix decoding).

    Forbidding after the softmax (as fairseq) keeps scores equal to the model's own log-probs.
    ``step`` may be a 0-dim device tensor (static decoding), which the host never reads.

    Shape: logits (N, V) -> (N, V) float32.
    """
    logp = torch.log_softmax(logits.float(), dim=-1)
    logp[:, config.pad_id] = -math.inf
    logp[:, config.bos_id] = -math.inf
    if isinstance(step, Tensor):
        logp[:, config.eos_id] = logp[:, config.eos_id].masked_fill(step < min_len, -math.inf)
    elif step < min_len:
        logp[:, config.eos_id] = -math.inf
    if forced is not None:
        token = forced.clamp(min=0).unsqueeze(1)                          # (N, 1)
        only = torch.full_like(logp, -math.inf).scatter_(1, token, logp.gather(1, token))
        logp = torch.where((forced >= 0).unsqueeze(1), only, logp)
    return logp


def forced_tokens(prefix: Tensor | None, sentence: Tensor, step: int) -> Tensor | None:
    """Each row's forced token at ``step`` (-1: free), from the (B, L) prefix ids of its
    ``sentence`` (-1-padded); None when no row has one left."""
    if prefix is None or step >= prefix.shape[1]:
        return None
    return prefix[sentence, step]


# Rows scored at a time on CPU by :func:`best_tokens`: the projection, log-softmax and top-k of
# a (rows, V) block of logits run while it is still in the CPU cache, which pays for large
# beam batches and changes nothing for small ones (BENCHMARKS.md, "Decoding speed").
SCORE_ROWS = 128


def best_tokens(model: Seq2Seq, states: Tensor, config: object, step: int | Tensor, min_len: int,
                k: int, forced: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Each row's ``k`` (at most V) most probable next tokens: :func:`step_log_probs` of the
    projected ``states`` (``forced`` tokens as it says), then :func:`topk_rows`, in blocks of
    ``SCORE_ROWS`` rows on CPU.

    Shape: states (N, D) -> log-probs (N, w), tokens (N, w), w = min(k, V).
    """
    def score(block: Tensor, forced_block: Tensor | None) -> tuple[Tensor, Tensor]:
        logp = step_log_probs(model.output_proj(block), config, step, min_len, forced_block)  # (rows, V)
        return topk_rows(logp, min(k, logp.shape[-1]))

    rows = max(SCORE_ROWS if states.device.type == "cpu" else states.shape[0], 1)
    blocks = states.split(rows)
    forced_blocks = forced.split(rows) if forced is not None else [None] * len(blocks)
    parts = [score(block, f) for block, f in zip(blocks, forced_blocks)]
    if len(parts) == 1:
        return parts[0]
    return torch.cat([v for v, _ in parts]), torch.cat([i for _, i in parts])


def _block_size(v: int, k: int) -> int | None:
    """A divisor of ``v`` near 100 leaving at least ``k`` blocks, or None."""
    for c in sorted(range(64, 161), key=lambda c: abs(c - 100)):
        if v % c == 0 and v // c >= k:
            return c
    return None


def topk_rows(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """``x.topk(k, dim=1)`` for wide rows (a vocabulary), about twice as fast on CPU.

    The k best entries of a row lie in the k blocks with the largest maxima, so one cheap
    max per block of ~100 entries narrows the search to k blocks. Falls back to ``topk``
    when no block size divides the row.

    Shape: x (N, V) -> values (N, k), indices (N, k).
    """
    n, v = x.shape
    c = _block_size(v, k)
    if c is None or x.device.type != "cpu":
        return x.topk(k, dim=1)
    blocks = x.view(n, v // c, c)                                         # (N, V/c, c)
    best = blocks.amax(dim=2).topk(k, dim=1).indices                      # (N, k) blocks
    rows = torch.arange(n, device=x.device).unsqueeze(1)
    values, i = blocks[rows, best].view(n, k * c).topk(k, dim=1)          # (N, k)
    return values, best.gather(1, i // c) * c + i % c


def cross_attention_row(cross: list[Tensor] | None, choice: AttentionChoice) -> Tensor:
    """One step's cross-attention of the chosen layer: one head or the mean over heads.

    Shape: each entry (N, H, 1, S) -> (N, S).
    """
    w = cross[choice.layer][:, :, -1]                                     # (N, H, S)
    return w.mean(dim=1) if choice.head is None else w[:, choice.head]


# Choose the next token from the decoder's output states (N, D) at a step (the second
# argument), each row's forced token or -1 (the third, or None for no forcing): returns the ids
# (N,) long and their log-probabilities (N,).
TokenChooser = Callable[[Tensor, int, Tensor | None], tuple[Tensor, Tensor]]


@dataclass
class _Rows:
    """Per-row state of the left-to-right loop; rows are dropped as they finish."""

    ids: Tensor        # (N,) which sentence of the batch each active row is
    last: Tensor       # (N, 1) the token fed to the next step
    prefix: Tensor     # (N, t + 1) BOS + tokens so far (only read by the uncached path)
    limit: Tensor      # (N,) max_len of each row


@torch.no_grad()  # search never needs gradients (and the pooled cache forbids them)
def sequential_search(model: Seq2Seq, src: Tensor, choose: TokenChooser, decode: DecodeConfig = DecodeConfig(),
                      attention: AttentionChoice | None = None, use_cache: bool = True,
                      prefix: Tensor | None = None) -> SearchOutput:
    """Extend one hypothesis per sentence a token at a time (greedy search and sampling).

    ``choose`` sees the decoder's output states (``decode(..., project=False)``) and does the
    output projection itself, so greedy search can score them in blocks (:func:`best_tokens`).

    Each step decodes only the newest token against the KV cache (``use_cache=False`` re-runs
    the whole prefix, for testing), so its cost does not grow with the prefix. Finished rows
    leave the batch. ``decode`` gives the length limits; ``attention`` says which
    cross-attention to record (None: none); ``prefix`` (B, L) ids, -1-padded, are each
    sentence's forced first tokens.

    Shape: src (B, S) -> SearchOutput with K = 1.
    """
    with prepared(model):
        return _sequential_search(model, src, choose, decode, attention, use_cache, prefix)


def _sequential_search(model: Seq2Seq, src: Tensor, choose: TokenChooser, decode: DecodeConfig,
                       attention: AttentionChoice | None, use_cache: bool, prefix: Tensor | None) -> SearchOutput:
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
    bos = torch.full((b, 1), cfg.bos_id, dtype=torch.long, device=device)
    rows = _Rows(torch.arange(b, device=device), bos, bos, limit)
    for step in range(t_cap):
        out = model.decode(rows.last if use_cache else rows.prefix, enc, cache, need_weights=need_attention,
                           project=False)
        token, token_logp = choose(out.states[:, -1], step, forced_tokens(prefix, rows.ids, step))  # (N,), (N,)
        out_tokens[rows.ids, step] = token
        out_logp[rows.ids] += token_logp
        if need_attention:
            out_attn[rows.ids, step] = cross_attention_row(out.cross_attentions, attention).float()
        done = (token == cfg.eos_id) | (rows.limit <= step + 1)           # (N,)
        out_lengths[rows.ids[done]] = step + 1
        rows = _Rows(rows.ids, token[:, None], torch.cat([rows.prefix, token[:, None]], dim=1), rows.limit)
        if bool(done.all()):
            break
        if bool(done.any()):
            keep = (~done).nonzero().squeeze(1)                           # (N',)
            rows = _Rows(rows.ids[keep], rows.last[keep], rows.prefix[keep], rows.limit[keep])
            enc = enc.index_select(keep)
            cache = cache.reorder(keep) if cache is not None else None
    return SearchOutput(out_tokens[:, None], out_lengths[:, None], out_logp[:, None].clone(),
                        out_logp[:, None], None if out_attn is None else out_attn[:, None])


def greedy_search(model: Seq2Seq, src: Tensor, decode: DecodeConfig = DecodeConfig(),
                  attention: AttentionChoice | None = None, use_cache: bool = True,
                  static: bool | None = None, prefix: Tensor | None = None) -> SearchOutput:
    """Pick the most probable token at each step (beam search with a beam of one).

    Args:
        model: an encoder-decoder with ``encode``/``decode``/``new_cache`` (see :class:`Seq2Seq`).
        src: (B, S) source ids, each row ending in EOS, right-padded with PAD.
        decode: the settings used here: ``max_len_a``/``max_len_b`` (output limit
            a * source_len + b tokens, EOS counted) and ``min_len`` (no EOS before it).
        attention: also return each output token's cross-attention of this layer and head.
        use_cache: decode incrementally with the KV cache (False re-runs the prefix).
        static: decode with static shapes (:mod:`~transduce.inference.static`: CUDA graphs on
            GPU), or not; None picks it on CUDA when no attention is recorded and no prefix given.
        prefix: (B, L) target ids each output must begin with, -1-padded (see :func:`prefix_ids`).

    Returns:
        :class:`SearchOutput` with K = 1; scores are summed log-probabilities.
    """
    from .static import static_search, use_static  # (it builds on this module)

    if use_cache and prefix is None and use_static(model, src, attention, static):
        return static_search(model, src, decode, greedy=True)
    cfg = model.config

    def most_probable(states: Tensor, step: int, forced: Tensor | None) -> tuple[Tensor, Tensor]:
        logp, token = best_tokens(model, states, cfg, step, decode.min_len, 1, forced)  # (N, 1) each
        return token.squeeze(1), logp.squeeze(1)

    return sequential_search(model, src, most_probable, decode, attention, use_cache, prefix)


def prefix_ids(prefixes: list[list[int]], device: torch.device | str = "cpu") -> Tensor | None:
    """(B, L) forced-prefix ids, -1-padded, for searches' ``prefix``; None when all are empty."""
    width = max((len(p) for p in prefixes), default=0)
    if width == 0:
        return None
    out = torch.full((len(prefixes), width), -1, dtype=torch.long)
    for i, p in enumerate(prefixes):
        out[i, : len(p)] = torch.tensor(p, dtype=torch.long)
    return out.to(device)
