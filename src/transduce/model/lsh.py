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
:func:`lsh_attention` (the sorted, chunked kernel, O(T * chunk)).

Legend: B batch, H heads, T length, Tq query length, Tk key length, Dh head dim, n rounds,
nbk buckets, c chunk, P slots of the sorted, chunk-padded layout, nc = P / c chunks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import ConfigError

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
    return torch.cat([x, -x], dim=-1).argmax(dim=-1)


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


def _sorted(x: Tensor, at: Tensor) -> Tensor:
    """Rows ``at`` (B, H, n, P) of x (B, H, T + 1, ...) (row T: an empty slot) -> (B, H, n, P, ...)."""
    b, h, n, p = at.shape
    x = x[:, :, None].expand(b, h, n, *x.shape[2:])
    idx = at.view(b, h, n, p, *([1] * (x.dim() - 4))).expand(b, h, n, p, *x.shape[4:])
    return x.gather(3, idx)


def _with_previous(x: Tensor, empty: float | int) -> Tensor:
    """Each chunk's rows after the previous chunk's (``empty`` before the first):
    (B, H, n, nc, c, ...) -> (B, H, n, nc, 2c, ...)."""
    prev = torch.cat([torch.full_like(x[:, :, :, :1], empty), x[:, :, :, :-1]], dim=3)
    return torch.cat([prev, x], dim=4)


def lsh_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, lsh: LSHAttention, is_causal: bool = False,
                  dropout: float = 0.0) -> Tensor:
    """:func:`lsh_reference` of self-attention (Tq = Tk = T, start 0) in O(T * c): per round, the
    positions sorted into chunks, each chunk attending to itself and the chunk before; the
    rounds combined by their log-sum-exp.

    Shape: q, k, v (B, H, T, Dh), mask (B, 1, 1, T) or None -> (B, H, T, Dh).
    """
    b, h, t, dh = q.shape
    bucket = lsh_buckets(k, lsh)                                            # (B, H, n, T)
    slot, n_slots = _slots(bucket, lsh)
    at = torch.full((*slot.shape[:-1], n_slots), t, dtype=torch.long, device=q.device)
    at.scatter_(-1, slot, torch.arange(t, device=q.device).expand_as(slot))  # position in each slot (T: empty)
    rows = [F.pad(x, (0, 0, 0, 1)) for x in (q, F.normalize(k, dim=-1), v)]  # (B, H, T + 1, Dh)
    c, nc = lsh.chunk, n_slots // lsh.chunk
    qs, ks, vs = (_sorted(x, at).unflatten(3, (nc, c)) for x in rows)      # (B, H, n, nc, c, Dh)
    bias = _chunk_bias(at.unflatten(3, (nc, c)), bucket, _key_mask(mask, b, t, q.device), is_causal)
    ks, vs = _with_previous(ks, 0.0), _with_previous(vs, 0.0)               # (B, H, n, nc, 2c, Dh)
    scores = qs @ ks.transpose(-2, -1) / math.sqrt(dh) + bias               # (B, H, n, nc, c, 2c)
    lse = scores.logsumexp(dim=-1, keepdim=True)
    out = F.dropout(torch.exp(scores - lse), dropout) @ vs                  # (B, H, n, nc, c, Dh)
    out, lse = out.flatten(3, 4), lse.flatten(3, 5)                         # (B, H, n, P, Dh), (B, H, n, P)
    out = out.gather(3, slot[..., None].expand(-1, -1, -1, -1, dh))          # (B, H, n, T, Dh): unsorted
    share = torch.softmax(lse.gather(3, slot), dim=2)                       # (B, H, n, T): each round's weight
    return (out * share[..., None]).sum(2)                                  # (B, H, T, Dh)


def _chunk_bias(q_pos: Tensor, bucket: Tensor, keep: Tensor, is_causal: bool) -> Tensor:
    """The additive mask of each chunk's (c x 2c) scores, from the layout: a chunk holds one
    bucket, its positions in order, then the empty slots; so the previous chunk is either all
    visible (the same bucket: earlier positions) or not at all, and causality inside a chunk is
    a triangle. 0: visible; -inf: another bucket, an empty slot, a padded key, a later key;
    -SELF_PENALTY on the query's own key (visible even if padded). An empty query slot sees its
    own (empty, zero) key, so that no row is all -inf.

    Shape: q_pos (B, H, n, nc, c) the position in each slot (T: empty), bucket (B, H, n, T),
    keep (B, T) -> (B, H, n, nc, c, 2c).
    """
    b, h, n, nc, c = q_pos.shape
    t = bucket.shape[-1]
    chunk_bucket = F.pad(bucket, (0, 1), value=-1).gather(3, q_pos[..., 0])  # (B, H, n, nc): its first slot's
    same = F.pad(chunk_bucket[..., 1:] == chunk_bucket[..., :-1], (1, 0), value=False)  # previous chunk: same bucket
    key_ok = F.pad(keep, (0, 1), value=False).gather(1, q_pos.reshape(b, -1)).view(q_pos.shape)  # real, not padded
    key_ok = torch.cat([_previous(key_ok) & same[..., None], key_ok], dim=-1)  # (B, H, n, nc, 2c)
    inf = float("-inf")
    bias = torch.zeros(key_ok.shape, device=q_pos.device).masked_fill(~key_ok, inf)[..., None, :]
    if is_causal:  # (later slots of the chunk are later positions, or empty)
        bias = bias + F.pad(torch.full((c, c), inf, device=q_pos.device).triu(1), (c, 0))  # (.., c, 2c)
    else:
        bias = bias.expand(b, h, n, nc, c, 2 * c)
    bias = bias.contiguous()
    bias.diagonal(offset=c, dim1=-2, dim2=-1).copy_(torch.where(q_pos < t, -SELF_PENALTY, 0.0))
    return bias


def _previous(x: Tensor) -> Tensor:
    """Each chunk's rows of the chunk before (False before the first): (B, H, n, nc, c) -> same."""
    return F.pad(x[:, :, :, :-1], (0, 0, 1, 0), value=False)
