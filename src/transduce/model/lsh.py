"""Reformer's locality-sensitive hashing (LSH) attention for long inputs (Kitaev et al., 2020,
https://arxiv.org/abs/2001.04451, Sec. 3): queries and keys are one projection (shared QK: the
module's ``k_proj`` is its ``q_proj``), keys are normalised, and a query attends only to keys that
fall in its hash bucket.

* **Angular LSH** (Sec. 3, Eq. 3 after Andoni et al., 2015): h(x) = argmax([xR; -xR]) for a random
  rotation R of (Dh x n_buckets/2), one per round, ``n_hashes`` rounds. R is drawn from the layer's
  seed (saved with the model), so training and decoding hash alike.
* **Sort and chunk**: per round, positions are sorted by (bucket, position) and each bucket is
  cut into chunks of ``chunk`` positions; a query attends to the keys of its bucket in its own
  chunk and the one before (Sec. 3, "sort by bucket", Fig. 2). Unlike the paper, a chunk never
  holds two buckets (each bucket is padded to whole chunks): then which keys a position sees
  depends only on the positions before it, so causal attention is truly causal and cached
  decoding equals uncached decoding.
* **Rounds combined** (Sec. 3, "multi-round LSH"): each round's output weighted by its share of
  the softmax normaliser (its log-sum-exp), so a key seen in n rounds counts n times.
* A token does not attend to itself unless nothing else is visible (Sec. 3, "causal masking
  for shared-QK attention": q . k of a token with itself would dominate).

Two implementations of the same function, proven equal in tests/model/test_sparse_attention.py:
:func:`lsh_reference` (dense: full attention under the mask "same bucket, same or previous chunk",
counted over the rounds; O(T^2); it also runs the few queries of a decoding step) and
:func:`lsh_attention` (the sorted, chunked kernel, O(T * chunk), in
:mod:`~transduce.model.gathered_attention`: flash-style, nothing sorted is kept for the backward pass).

Legend: B batch, H heads, T length, Tq query length, Tk key length, Dh head dim, n rounds,
nbk buckets, c chunk, P slots of the sorted, chunk-padded layout, nc = P / c chunks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import ConfigError
from .gathered_attention import Step, gathered_attention, step_size

SELF_PENALTY = 1e5  # Reformer's score for a token's own key: used only when nothing else is visible


@dataclass(frozen=True)
class LSHAttention:
    """The kernel of ``model.attention="lsh"``, called by :meth:`MultiHeadAttention.attend`
    (whose ``k_proj`` is its ``q_proj``): ``n_hashes`` rounds into ``n_buckets`` buckets, chunks
    of ``chunk`` sorted positions, rotations drawn from ``seed``."""

    chunk: int
    n_hashes: int
    n_buckets: int
    seed: int

    def __post_init__(self) -> None:  # (config checks the same; this guards direct use)
        if self.chunk < 1 or self.n_hashes < 1 or self.n_buckets < 2 or self.n_buckets % 2:
            raise ConfigError(f"model.attention: lsh needs chunk >= 1, n_hashes >= 1 and an even n_buckets >= 2; "
                              f"got {self.chunk}, {self.n_hashes}, {self.n_buckets}")

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool, start: int,
                 dropout: float) -> Tensor:
        if mask is not None and mask.shape[-2] != 1:
            raise ConfigError("model.attention: lsh takes a key (padding) mask, not a per-query mask")
        if start == 0 and q.shape[-2] == k.shape[-2]:
            return lsh_attention(q, k, v, mask, self, is_causal, dropout)
        return lsh_reference(q, k, v, mask, self, is_causal, start, dropout)  # a decoding step: few queries

    def with_weights(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool,
                     dropout: float) -> tuple[Tensor, Tensor]:
        raise ConfigError("model.attention: attention maps need full attention; this model has lsh attention")


def lsh_buckets(k: Tensor, lsh: LSHAttention) -> Tensor:
    """The bucket of every key in every round: argmax([kR; -kR]) -> (B, H, n, T) long."""
    g = torch.Generator().manual_seed(lsh.seed)
    rotations = torch.randn(k.shape[-1], lsh.n_hashes, lsh.n_buckets // 2, generator=g).to(k)  # (Dh, n, nbk/2)
    x = torch.einsum("bhtd,dnr->bhntr", k.detach(), rotations)             # (B, H, n, T, nbk/2)
    high, i = x.max(dim=-1)  # argmax([x; -x]) without the copy: the first maximum, x's before -x's
    low, j = x.min(dim=-1)
    return torch.where(high >= -low, i, j + lsh.n_buckets // 2)


def _key_mask(mask: Tensor | None, b: int, t: int, device: torch.device) -> Tensor:
    """A key mask (B, 1, 1, T) or None as (B, T) bool."""
    return torch.ones(b, t, dtype=torch.bool, device=device) if mask is None else mask.reshape(b, t)


# The reference: dense, masked by bucket and chunk.

def lsh_reference(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, lsh: LSHAttention, is_causal: bool = False,
                  start: int = 0, dropout: float = 0.0) -> Tensor:
    """LSH attention as Eq. 1 over every key, with query i's score for key j raised by log n_ij
    (n_ij: rounds in which j shares i's bucket and lies in i's chunk or the one before) and
    -inf where n_ij = 0; the queries are positions start .. start + Tq - 1 of the Tk keys.

    Shape: q (B, H, Tq, Dh), k and v (B, H, Tk, Dh), mask (B, 1, 1, Tk) or None -> (B, H, Tq, Dh).
    """
    (b, _, t_q, dh), t_k = q.shape, k.shape[-2]
    bucket = lsh_buckets(k, lsh)                                            # (B, H, n, Tk)
    rank = F.one_hot(bucket, lsh.n_buckets).cumsum(-2).gather(-1, bucket[..., None])[..., 0] - 1  # within bucket
    chunk = rank // lsh.chunk                                               # (B, H, n, Tk)
    q_pos = torch.arange(start, start + t_q, device=q.device)
    k_pos = torch.arange(t_k, device=q.device)
    same = bucket[..., q_pos, None] == bucket[..., None, :]                 # (B, H, n, Tq, Tk)
    behind = chunk[..., q_pos, None] - chunk[..., None, :]
    count = (same & ((behind == 0) | (behind == 1))).sum(2)                 # (B, H, Tq, Tk)
    own = q_pos[:, None] == k_pos[None, :]                                  # (Tq, Tk)
    allowed = (count > 0) & (_key_mask(mask, b, t_k, q.device)[:, None, None] | own)
    if is_causal:
        allowed = allowed & (k_pos[None, :] <= q_pos[:, None])
    scores = q @ F.normalize(k, dim=-1).transpose(-2, -1) / math.sqrt(dh)   # (B, H, Tq, Tk)
    scores = (scores - SELF_PENALTY * own + count.clamp(min=1).to(q.dtype).log()).masked_fill(~allowed, float("-inf"))
    return F.dropout(torch.softmax(scores, dim=-1), dropout) @ v            # (B, H, Tq, Dh)


# The kernel: sorted by bucket, in chunks.

def _slots(bucket: Tensor, lsh: LSHAttention) -> tuple[Tensor, int]:
    """Where each position goes in the sorted layout: positions sorted by (bucket, position),
    each bucket starting a new chunk -> slot of each position (B, H, n, T) and P, the slots the
    fullest layout needs (a multiple of the chunk)."""
    t = bucket.shape[-1]
    order = (bucket * t + torch.arange(t, device=bucket.device)).argsort(dim=-1)  # sorted positions
    counts = torch.zeros(*bucket.shape[:-1], lsh.n_buckets, dtype=torch.long, device=bucket.device)
    counts.scatter_add_(-1, bucket, torch.ones_like(bucket))               # (B, H, n, nbk)
    padded = -(-counts // lsh.chunk) * lsh.chunk
    offset = padded.cumsum(-1) - padded                                     # first slot of each bucket
    first = counts.cumsum(-1) - counts                                      # first sorted index of each bucket
    sorted_bucket = bucket.gather(-1, order)
    rank = torch.arange(t, device=bucket.device) - first.gather(-1, sorted_bucket)
    slot = torch.empty_like(order).scatter_(-1, order, offset.gather(-1, sorted_bucket) + rank)
    return slot, int(padded.sum(-1).max())


def lsh_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, lsh: LSHAttention, is_causal: bool = False,
                  dropout: float = 0.0, step_scores: int | None = None) -> Tensor:
    """:func:`lsh_reference` of self-attention (Tq = Tk = T, start 0) in O(T * c): per round, the
    positions sorted into chunks, each chunk attending to itself and the chunk before, through
    :func:`~transduce.model.gathered_attention.gathered_attention`, which combines the rounds by
    their softmax statistics; it also scales the keys to unit length, a step at a time. Kept for
    the backward pass: q, k, v, the output, two statistics per position and the layout (the
    position in each slot); the sorted copies, the normalised keys and the chunks' scores are
    recomputed a step (``step_scores`` scores at most; default:
    :func:`~transduce.model.gathered_attention.step_size` of T) at a time.

    Shape: q, k, v (B, H, T, Dh), mask (B, 1, 1, T) or None -> (B, H, T, Dh).
    """
    b, h, t, dh = q.shape
    bucket = lsh_buckets(k, lsh)                                            # (B, H, n, T)
    slot, n_slots = _slots(bucket, lsh)
    at = torch.full((*slot.shape[:-1], n_slots), t, dtype=torch.long, device=q.device)
    at.scatter_(-1, slot, torch.arange(t, device=q.device).expand_as(slot))  # position in each slot (T: empty)
    chunks = at.unflatten(3, (n_slots // lsh.chunk, lsh.chunk))             # (B, H, n, nc, c)
    key_ok = _visible(chunks, bucket, _key_mask(mask, b, t, q.device))      # (B, H, n, nc, 2c)
    step_scores = step_size(t) if step_scores is None else step_scores
    plan = partial(_steps, chunks, key_ok, t, is_causal, step_scores)      # (the layout alone: bucket is freed)
    return gathered_attention(q, k, v, plan, dropout, unit_keys=True)


def _visible(chunks: Tensor, bucket: Tensor, keep: Tensor) -> Tensor:
    """Whether each chunk's 2c key slots (the previous chunk's, then its own) hold a real, kept key
    of its bucket. ``chunks`` (B, H, n, nc, c) the position in each slot (T: empty), ``bucket``
    (B, H, n, T), ``keep`` (B, T) the key mask -> (B, H, n, nc, 2c) bool."""
    b = keep.shape[0]
    chunk_bucket = F.pad(bucket, (0, 1), value=-1).gather(3, chunks[..., 0])  # (B, H, n, nc): its first slot's
    same = F.pad(chunk_bucket[..., 1:] == chunk_bucket[..., :-1], (1, 0), value=False)  # previous chunk: same bucket
    key_ok = F.pad(keep, (0, 1), value=False).gather(1, chunks.reshape(b, -1)).view(chunks.shape)  # real, not padded
    return torch.cat([_previous(key_ok) & same[..., None], key_ok], dim=-1)


def _steps(chunks: Tensor, key_ok: Tensor, t: int, is_causal: bool, step_scores: int) -> Iterator[Step]:
    """The plan: round by round, a few chunks a step, each chunk's c query slots over the 2c key
    slots of the chunk before and itself. ``chunks`` (B, H, n, nc, c) the position in each slot
    (T: empty), ``key_ok`` (B, H, n, nc, 2c) from :func:`_visible`."""
    _, _, n, n_chunks, c = chunks.shape
    per_step = max(1, step_scores // (2 * c * c))
    for r in range(n):
        for first in range(0, n_chunks, per_step):
            part = slice(first, first + per_step)
            yield Step(chunks[:, :, r, part], _with_previous(chunks[:, :, r], part, t),
                       _chunk_bias(key_ok[:, :, r, part], is_causal))


def _with_previous(chunks: Tensor, part: slice, empty: int) -> Tensor:
    """Chunks ``part`` of a round (B, H, nc, c), each chunk's rows after the previous chunk's
    (``empty`` before the first) -> (B, H, g, 2c); built a step at a time, so that no (2c) copy
    of the whole layout is kept."""
    x = chunks[:, :, part]                                                  # (B, H, g, c)
    first, g = part.start, x.shape[2]
    prev = F.pad(chunks[:, :, max(first - 1, 0):first + g - 1], (0, 0, int(first == 0), 0), value=empty)
    return torch.cat([prev, x], dim=-1)


def _chunk_bias(key_ok: Tensor, is_causal: bool) -> Tensor:
    """The additive mask of some chunks' (c x 2c) scores, from the layout: a chunk holds one
    bucket, its positions in order, then the empty slots; so the previous chunk is either all
    visible (the same bucket: earlier positions) or not at all, and causality inside a chunk is
    a triangle. 0: visible; -inf: another bucket, an empty slot, a padded key, a later key;
    -SELF_PENALTY on the query's own key (visible even if padded; an empty slot's is masked by
    :func:`~transduce.model.gathered_attention.gathered_attention`).

    Shape: key_ok (B, H, g, 2c) whether each key slot is a real, kept key of the query's bucket
    -> (B, H, g, c, 2c).
    """
    c = key_ok.shape[-1] // 2
    inf = float("-inf")
    bias = torch.zeros(key_ok.shape, device=key_ok.device).masked_fill(~key_ok, inf)[..., None, :]
    if is_causal:  # (later slots of the chunk are later positions, or empty)
        bias = bias + F.pad(torch.full((c, c), inf, device=key_ok.device).triu(1), (c, 0))  # (.., c, 2c)
    else:
        bias = bias.expand(*key_ok.shape[:-1], c, 2 * c)
    bias = bias.contiguous()
    bias.diagonal(offset=c, dim1=-2, dim2=-1).fill_(-SELF_PENALTY)
    return bias


def _previous(x: Tensor) -> Tensor:
    """Each chunk's rows of the chunk before (False before the first): (B, H, n, nc, c) -> same."""
    return F.pad(x[:, :, :, :-1], (0, 0, 1, 0), value=False)
