"""Scaled dot-product and multi-head attention (Sec. 3.2), with an explicit key/value cache.

Legend: B batch, H heads, Tq query length, Tk key length, D d_model, Dh = D / H.
Masks are boolean, True = may attend (see :mod:`transduce.model.masks`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .embeddings import RotaryEmbedding
from .masks import causal_mask, combine


def attention_weights(q: Tensor, k: Tensor, mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
    """softmax(Q K^T / sqrt(d_k)) with masked keys set to -inf (Eq. 1). -> (B, H, Tq, Tk)."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])           # (B, H, Tq, Tk)
    if is_causal:
        mask = combine(mask, causal_mask(q.shape[-2], k.shape[-2], q.device))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores.float(), dim=-1).to(q.dtype)


def _single_query_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
    """Eq. 1 for one query per row (incremental decoding) as two batched matmuls over B*H,
    several times faster on CPU than the flash kernel at this shape.

    Shape: q (B, H, 1, Dh), k and v (B, H, Tk, Dh), mask broadcastable to (B, H, 1, Tk)
    -> (B, H, 1, Dh).
    """
    b, h, _, dh = q.shape
    t_k = k.shape[-2]
    scores = torch.bmm(q.reshape(b * h, 1, dh), k.reshape(b * h, t_k, dh).transpose(1, 2))  # (BH, 1, Tk)
    scores = scores.view(b, h, 1, t_k).mul_(1.0 / math.sqrt(dh))
    if mask is not None:
        scores = scores.masked_fill_(~mask, float("-inf"))
    weights = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    return torch.bmm(weights.view(b * h, 1, t_k), v.reshape(b * h, t_k, dh)).view(b, h, 1, dh)


def scaled_dot_product_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, dropout: float = 0.0,
    is_causal: bool = False, need_weights: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V (Eq. 1).

    The fast path calls ``F.scaled_dot_product_attention`` (flash / memory-efficient kernels on
    CUDA); ``need_weights=True`` takes the explicit math path and also returns the weights.

    Shape: q (B, H, Tq, Dh), k and v (B, H, Tk, Dh), mask broadcastable to (B, H, Tq, Tk)
    -> output (B, H, Tq, Dh), weights (B, H, Tq, Tk) or None.
    """
    if not need_weights and q.shape[-2] == 1 and q.device.type == "cpu" and not dropout:
        return _single_query_attention(q, k, v, mask), None
    if not need_weights:
        t_q, t_k = q.shape[-2], k.shape[-2]
        # SDPA takes a mask or is_causal, not both, and aligns is_causal top-left; we need
        # bottom-right alignment when the queries are the last Tq of Tk positions (cache).
        if is_causal and (mask is not None or t_q != t_k):
            mask = combine(mask, causal_mask(t_q, t_k, q.device))
            is_causal = False
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=is_causal)
        return out, None
    weights = attention_weights(q, k, mask, is_causal)
    out = F.dropout(weights, dropout) @ v                               # (B, H, Tq, Dh)
    return out, weights


@dataclass
class LayerCache:
    """One decoder layer's cached keys and values. Shapes (B, H, T, Dh) and (B, H, S, Dh).

    By default :meth:`append` grows ``self_k``/``self_v`` with ``torch.cat`` and
    :meth:`reorder` gathers rows at once: functional and traceable (export uses this).

    With ``chunk > 0`` (search, see :meth:`KVCache.in_place`) keys/values live in two
    preallocated flat pools used in turn: each append writes the old entries (gathered by a
    pending reorder, if any) and the new ones into the other pool as one contiguous
    (B, H, t + T, Dh) tensor. A beam step then costs one copy per tensor and no allocation,
    and attention reads tightly packed keys. ``reorder`` is lazy (applied by the next append,
    so ``self_k``/``self_v`` keep the old rows until then) and spends the source cache.
    """

    self_k: Tensor | None = None
    self_v: Tensor | None = None
    cross_k: Tensor | None = None
    cross_v: Tensor | None = None
    chunk: int = 0
    pools: tuple | None = None        # ((k, v) flat pool holding self_k/self_v, (k, v) the other)
    pending: Tensor | None = None     # (B',) rows to gather at the next append

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add new keys/values (B, H, T, Dh) after the cached ones -> all (B, H, t + T, Dh)."""
        if not self.chunk:
            if self.self_k is not None:
                k = torch.cat([self.self_k, k], dim=2)                   # (B, H, t + T, Dh)
                v = torch.cat([self.self_v, v], dim=2)
            self.self_k, self.self_v = k, v
            return k, v
        t = 0 if self.self_k is None else self.self_k.shape[2]
        b, h, n_new, dh = k.shape
        need = b * h * (t + n_new) * dh
        current, other = self.pools if self.pools is not None else (None, None)
        if other is None or other[0].numel() < need:
            size = b * h * (t + n_new + self.chunk) * dh
            other = (k.new_empty(size), k.new_empty(size))
        views = []
        for pool, old, new in zip(other, (self.self_k, self.self_v), (k, v)):
            view = pool[:need].view(b, h, t + n_new, dh)                 # contiguous
            if old is not None and self.pending is not None:
                torch.index_select(old, 0, self.pending, out=view[:, :, :t])  # reorder + copy
            elif old is not None:
                view[:, :, :t] = old
            view[:, :, t:] = new
            views.append(view)
        self.self_k, self.self_v = views
        self.pools, self.pending = (other, current), None
        return self.self_k, self.self_v

    def reorder(self, index: Tensor, cross: bool = True) -> "LayerCache":
        """A cache holding batch rows ``index`` (B',) of this one (see :meth:`KVCache.reorder`)."""
        def pick(t: Tensor | None, do: bool = True) -> Tensor | None:
            return t.index_select(0, index) if (t is not None and do) else t

        cross_k, cross_v = pick(self.cross_k, cross), pick(self.cross_v, cross)
        if not self.chunk or self.self_k is None:
            return LayerCache(pick(self.self_k), pick(self.self_v), cross_k, cross_v, self.chunk)
        pending = index if self.pending is None else self.pending.index_select(0, index)
        out = LayerCache(self.self_k, self.self_v, cross_k, cross_v, self.chunk, self.pools, pending)
        self.self_k = self.self_v = self.pools = self.pending = None       # spent: pools move on
        return out


@dataclass
class KVCache:
    """Key/value cache for incremental decoding, passed into and returned by ``decode``.

    Self-attention keys/values grow by one entry per step; cross-attention keys/values are
    computed from the encoder output once, on the first step, and reused after.
    """

    layers: list[LayerCache]
    length: int = 0

    @classmethod
    def empty(cls, n_layers: int, chunk: int = 0) -> "KVCache":
        """An empty cache; ``chunk > 0`` selects in-place preallocated buffers (see LayerCache)."""
        return cls([LayerCache(chunk=chunk) for _ in range(n_layers)])

    def in_place(self, chunk: int = 16) -> "KVCache":
        """An empty cache like this one that keeps keys/values in two preallocated pools per
        tensor (grown ``chunk`` positions at a time) and reorders lazily: faster search, not
        for tracing/export, and a reordered cache's source is spent. Only before the first step."""
        if self.length:
            raise ValueError("in_place() needs an empty cache")
        return KVCache.empty(len(self.layers), chunk)

    def reorder(self, index: Tensor, cross: bool = True) -> "KVCache":
        """Select batch rows (beam reordering / expansion). index: (B',) long.

        ``cross=False`` leaves cross-attention entries alone, valid when ``index`` only permutes
        rows that share a source sentence (beams of one sentence).
        """
        return KVCache([c.reorder(index, cross) for c in self.layers], self.length)


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O (Sec. 3.2.2).

    Used as self-attention (``forward(x, x, ...)``) and as encoder-decoder attention
    (queries from the decoder, keys/values from the encoder output).

    Args:
        d_model: model width D.
        n_heads: number of heads H (D must divide by H).
        dropout: dropout on attention weights.
        bias: whether the four projections have biases.
        rope: a rotary embedding applied to q and k (self-attention only), or None.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, bias: bool = True,
                 rope: RotaryEmbedding | None = None):
        super().__init__()
        self.n_heads, self.head_dim = n_heads, d_model // n_heads
        self.dropout = dropout
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self.rope = rope

    def split_heads(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, Dh)

    def project_kv(self, x: Tensor, start: int = 0) -> tuple[Tensor, Tensor]:
        """Keys and values of x (B, T, D) -> two (B, H, T, Dh), rotated if RoPE is on."""
        k, v = self.split_heads(self.k_proj(x)), self.split_heads(self.v_proj(x))
        if self.rope is not None:
            k = self.rope(k, start)
        return k, v

    def forward(
        self, query: Tensor, key_value: Tensor | None, mask: Tensor | None = None,
        is_causal: bool = False, kv: tuple[Tensor, Tensor] | None = None,
        start: int = 0, need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from ``query`` (B, Tq, D) to ``key_value`` (B, Tk, D).

        Args:
            kv: precomputed (k, v), each (B, H, Tk, Dh), used instead of projecting key_value.
            start: position of the first query (for RoPE with a cache).
        Returns:
            (B, Tq, D) output and (B, H, Tq, Tk) weights if ``need_weights`` else None.
        """
        q = self.split_heads(self.q_proj(query))                         # (B, H, Tq, Dh)
        if self.rope is not None:
            q = self.rope(q, start)
        k, v = kv if kv is not None else self.project_kv(key_value, start)
        dropout = self.dropout if self.training else 0.0
        out, weights = scaled_dot_product_attention(q, k, v, mask, dropout, is_causal, need_weights)
        b, _, t, _ = out.shape
        out = out.transpose(1, 2).reshape(b, t, -1)                      # (B, Tq, D)
        return self.out_proj(out), weights
