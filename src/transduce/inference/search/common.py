"""What every search shares: the output type, length limits, step log-probabilities and
scoring in blocks.

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

import functools
import math
from dataclasses import dataclass
from typing import Callable, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from ...config.model import never_generated
from ...tracing import SOFTMAX, scope
from .repetition import Repetition


# Told after each step of a search which tokens are decided (streaming): the batch rows (N,),
# their tokens so far (N, t) and how many of those no later step can change (N,) (an EOS
# among them ends the row). Greedy search and speculative decoding settle every token they
# choose; beam search settles the prefix common to every hypothesis that can still win.
StepHook = Callable[[Tensor, Tensor, Tensor], None]


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

    def rows(self) -> list[tuple[list, list, list, list]]:
        """Each sentence's (tokens (K, T), lengths (K), scores (K), log-probs (K)) as Python lists:
        one conversion for the batch, not a few small tensor reads per hypothesis."""
        return list(zip(self.tokens.tolist(), self.lengths.tolist(), self.scores.tolist(), self.log_probs.tolist()))


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


def output_log_softmax(logits: Tensor, config: object) -> Tensor:
    """Log-softmax of ``logits`` (..., V) over the output's classes: every id, BOS's logit set to
    -inf first where ``config.bos_in_softmax`` is false (an imported T5: ModelConfig.bos_in_softmax)."""
    if not getattr(config, "bos_in_softmax", True):
        logits = logits.clone()
        logits[..., config.bos_id] = -math.inf
    return torch.log_softmax(logits, dim=-1)


def step_log_probs(logits: Tensor, config: object, step: int | Tensor, min_len: int,
                   forced: Tensor | None = None, repeat: Repetition | None = None,
                   normalize: bool = True) -> Tensor:
    """Log-softmax over the output's classes (:func:`output_log_softmax`), then forbid PAD, BOS and
    (before ``min_len``) EOS; rows with a ``forced`` token (N,) (-1: none) may only take that one
    (prefix decoding). With ``repeat``, its penalty applies to the logits and its n-gram blocking
    to the log-probs (:mod:`.repetition`): every search applies them here. Without ``normalize``,
    the logits themselves, forbidden alike (in place: float32 ``logits`` are changed): the same
    order in each row, for a choice that needs no score (greedy search unscored, :func:`best_tokens`).

    Forbidding after the softmax (as fairseq) keeps scores equal to the model's own log-probs.
    ``step`` may be a 0-dim device tensor (static decoding), which the host never reads.

    Shape: logits (N, V) -> (N, V) float32.
    """
    logits = logits if logits.dtype == torch.float32 else logits.float()
    if repeat is not None:
        logits = repeat.penalise(logits)
    logp = output_log_softmax(logits, config) if normalize else logits
    if repeat is not None:
        logp = repeat.block(logp)
    never = never_generated(config.pad_id, config.bos_id, config.eos_id)  # not one that is EOS too (GPT-2)
    if isinstance(step, Tensor):
        logp[:, config.eos_id] = logp[:, config.eos_id].masked_fill(step < min_len, -math.inf)
    elif step < min_len:
        never += (config.eos_id,)
    if never:  # (one op for every forbidden column: a step's fixed cost matters for small models)
        logp.index_fill_(1, _kept(_columns, never, logp.device), -math.inf)
    if forced is not None:
        token = forced.clamp(min=0).unsqueeze(1)                          # (N, 1)
        only = torch.full_like(logp, -math.inf).scatter_(1, token, logp.gather(1, token))
        logp = torch.where((forced >= 0).unsqueeze(1), only, logp)
    return logp


def _kept(make, *args):
    """``make(*args)`` from its ``functools.lru_cache``; made afresh while ``torch.compile`` traces
    (a constant of the compiled step: dynamo does not trace the cache)."""
    return make.__wrapped__(*args) if torch.compiler.is_compiling() else make(*args)


@functools.lru_cache(maxsize=32)
def _columns(ids: tuple[int, ...], device: torch.device) -> Tensor:
    """``ids`` as a long tensor, made once per tuple and device (read-only; a normal tensor
    even when first asked for under inference mode, so that autograd may read it later)."""
    with torch.inference_mode(False):
        return torch.tensor(ids, dtype=torch.long, device=device)


def forced_tokens(prefix: Tensor | None, sentence: Tensor, step: int) -> Tensor | None:
    """Each row's forced token at ``step`` (-1: free), from the (B, L) prefix ids of its
    ``sentence`` (-1-padded); None when no row has one left."""
    if prefix is None or step >= prefix.shape[1]:
        return None
    return prefix[sentence, step]


# What :func:`best_tokens` shows each block of log-probs (rows start:start + R, V) before its top-k.
BlockHook = Callable[[Tensor, int], None]

# Rows scored at a time on CPU by :func:`best_tokens`: the projection, log-softmax and top-k of
# a (rows, V) block of logits run while it is still in the CPU cache, which pays for large
# beam batches and changes nothing for small ones (BENCHMARKS.md, "Decoding speed").
SCORE_ROWS = 128


@dataclass(frozen=True)
class _Specials:
    """PAD, BOS and EOS as columns of a :class:`BatchVocab`'s logits (what :func:`step_log_probs` reads)."""

    pad_id: int
    bos_id: int
    eos_id: int
    bos_in_softmax: bool = True


@dataclass(frozen=True)
class BatchVocab:
    """A batch's target shortlist (:mod:`transduce.inference.search.shortlist`): the output projection's
    rows of the sorted ids (U,) it may produce, which always hold PAD, BOS and EOS."""

    ids: Tensor            # (U,) sorted target ids
    weight: Tensor         # (U, D)
    bias: Tensor | None    # (U,)
    specials: _Specials

    @classmethod
    def restrict(cls, proj: object, ids: Tensor, config: object) -> "BatchVocab | None":
        """``proj``'s rows of ``ids``; None unless ``proj`` holds a plain weight matrix (not a
        dynamic int8 layer's packed one, nor a static int8 layer's tensor subclass)."""
        weight, bias = getattr(proj, "weight", None), getattr(proj, "bias", None)
        if not isinstance(weight, Tensor) or type(weight.data) is not Tensor \
                or (bias is not None and not isinstance(bias, Tensor)):
            return None
        ids = ids.to(weight.device)
        col = {int(i): j for j, i in enumerate(ids.tolist())}
        specials = _Specials(col[config.pad_id], col[config.bos_id], col[config.eos_id],
                             getattr(config, "bos_in_softmax", True))
        return cls(ids, weight.index_select(0, ids), None if bias is None else bias.index_select(0, ids), specials)


def best_tokens(model: Seq2Seq, states: Tensor, config: object, step: int | Tensor, min_len: int,
                k: int, forced: Tensor | None = None, repeat: Repetition | None = None,
                vocab: BatchVocab | None = None, hook: BlockHook | None = None,
                scored: bool = True) -> tuple[Tensor, Tensor]:
    """Each row's ``k`` (at most V) most probable next tokens: :func:`step_log_probs` of the
    projected ``states`` (``forced`` tokens and ``repeat`` as it says), then :func:`topk_rows`,
    in blocks of ``SCORE_ROWS`` rows on CPU. ``hook(logp, start)`` is shown each block's
    log-probs (rows start:start + R, V) before the top-k and may change them in place
    (constrained search's refusals). With a ``vocab`` shortlist (and neither ``forced`` tokens,
    ``repeat`` nor a ``hook``, which read the whole vocabulary), only over its ids.

    Not ``scored`` (``k`` 1: greedy search whose caller wants only the text), the token is the
    largest forbidden-masked logit, no softmax over the vocabulary, and its log-prob is returned
    as 0: the same token as the scored choice unless two logits round to one log-prob (a tie the
    scored choice breaks by the lower id).

    Shape: states (N, D) -> log-probs (N, w), tokens (N, w), w = min(k, V) (min(k, U) with ``vocab``).
    """
    if not scored and k != 1:
        raise ValueError(f"best_tokens: only a choice of one token (k=1) goes unscored, not k={k}")
    if vocab is not None and forced is None and repeat is None and hook is None:
        with scope(SOFTMAX):
            logp = step_log_probs(F.linear(states, vocab.weight, vocab.bias), vocab.specials, step, min_len,
                                  normalize=scored)  # (N, U)
            values, cols = logp.topk(min(k, logp.shape[-1]), dim=1)
        return values if scored else torch.zeros_like(values), vocab.ids[cols]

    def score(start: int, block: Tensor) -> tuple[Tensor, Tensor]:
        stop = start + block.shape[0]
        logp = step_log_probs(model.output_proj(block), config, step, min_len,
                              None if forced is None else forced[start:stop],
                              None if repeat is None else repeat.rows(start, stop), scored)  # (rows, V)
        if hook is not None:
            hook(logp, start)
        values, tokens = topk_rows(logp, min(k, logp.shape[-1]))
        return values if scored else torch.zeros_like(values), tokens

    rows = max(SCORE_ROWS if states.device.type == "cpu" else states.shape[0], 1)
    with scope(SOFTMAX):
        blocks = states.split(rows) if states.shape[0] > rows else (states,)
        parts = [score(i * rows, block) for i, block in enumerate(blocks)]
    if len(parts) == 1:
        return parts[0]
    return torch.cat([v for v, _ in parts]), torch.cat([i for _, i in parts])


@functools.lru_cache(maxsize=None)
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
    if k == 1:  # (greedy: a row's maximum is one op)
        values, indices = x.max(dim=1, keepdim=True)
        return values, indices
    n, v = x.shape
    c = _kept(_block_size, v, k)
    if c is None or x.device.type != "cpu":
        return x.topk(k, dim=1)
    blocks = x.view(n, v // c, c)                                         # (N, V/c, c)
    best = blocks.amax(dim=2).topk(k, dim=1).indices.unsqueeze(2)         # (N, k, 1) blocks
    values, i = blocks.gather(1, best.expand(n, k, c)).view(n, k * c).topk(k, dim=1)  # (N, k)
    # each candidate's column in x, read off by i (no division: one integer op per entry)
    columns = (best * c + _kept(_offsets, c, x.device)).view(n, k * c)    # (N, k*c)
    return values, columns.gather(1, i)


@functools.lru_cache(maxsize=8)
def _offsets(c: int, device: torch.device) -> Tensor:
    """0..c-1 as a (1, 1, c) long tensor, made once per block size (read-only)."""
    return torch.arange(c, device=device).view(1, 1, c)


def cross_attention_row(cross: list[Tensor] | None, choice: AttentionChoice) -> Tensor:
    """One step's cross-attention of the chosen layer: one head or the mean over heads.

    Shape: each entry (N, H, 1, S) -> (N, S).
    """
    w = cross[choice.layer][:, :, -1]                                     # (N, H, S)
    return w.mean(dim=1) if choice.head is None else w[:, choice.head]


def prefix_ids(prefixes: list[list[int]], device: torch.device | str = "cpu") -> Tensor | None:
    """(B, L) forced-prefix ids, -1-padded, for searches' ``prefix``; None when all are empty."""
    width = max((len(p) for p in prefixes), default=0)
    if width == 0:
        return None
    out = torch.full((len(prefixes), width), -1, dtype=torch.long)
    for i, p in enumerate(prefixes):
        out[i, : len(p)] = torch.tensor(p, dtype=torch.long)
    return out.to(device)
