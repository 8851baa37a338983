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
        # One query per row (incremental decoding): two small matmuls beat the CPU flash
        # kernel several times over, and accept the strided keys of an in-place cache.
        return attention_weights(q, k, mask) @ v, None                  # (B, H, 1, Dh)
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

    By default :meth:`append` grows ``self_k``/``self_v`` with ``torch.cat`` (functional and
    traceable, for export). With ``chunk > 0`` they are views of preallocated (B, H, capacity,
    Dh) buffers written in place and grown ``chunk`` positions at a time; :meth:`reorder`
    then gathers into a recycled spare pair of buffers, so a search step allocates nothing.
    The price: after ``reorder`` the source cache is spent and must not be used again.
    """

    self_k: Tensor | None = None
    self_v: Tensor | None = None
    cross_k: Tensor | None = None
    cross_v: Tensor | None = None
    chunk: int = 0
    buffers: tuple[Tensor, Tensor] | None = None
    spare: tuple[Tensor, Tensor] | None = None

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add new keys/values (B, H, T, Dh) after the cached ones -> all (B, H, t + T, Dh)."""
        if not self.chunk:
            if self.self_k is not None:
                k = torch.cat([self.self_k, k], dim=2)                   # (B, H, t + T, Dh)
                v = torch.cat([self.self_v, v], dim=2)
            self.self_k, self.self_v = k, v
            return k, v
        t = 0 if self.self_k is None else self.self_k.shape[2]
        end = t + k.shape[2]
        if self.buffers is None or self.buffers[0].shape[2] < end:
            self.buffers, self.spare = self._grown(k, end), None
        self.buffers[0][:, :, t:end] = k
        self.buffers[1][:, :, t:end] = v
        self.self_k, self.self_v = (buf[:, :, :end] for buf in self.buffers)
        return self.self_k, self.self_v

    def _grown(self, like: Tensor, end: int) -> tuple[Tensor, Tensor]:
        """Buffers with room for ``end`` positions (rounded up to ``chunk``), old part copied."""
        b, h, _, dh = like.shape
        capacity = -(-end // self.chunk) * self.chunk
        bufs = (like.new_empty(b, h, capacity, dh), like.new_empty(b, h, capacity, dh))
        if self.buffers is not None:
            t = self.self_k.shape[2]
            bufs[0][:, :, :t], bufs[1][:, :, :t] = self.self_k, self.self_v
        return bufs

    def reorder(self, index: Tensor, cross: bool = True) -> "LayerCache":
        """A cache holding batch rows ``index`` (B',) of this one (see :meth:`KVCache.reorder`)."""
        def pick(t: Tensor | None, do: bool = True) -> Tensor | None:
            return t.index_select(0, index) if (t is not None and do) else t

        cross_k, cross_v = pick(self.cross_k, cross), pick(self.cross_v, cross)
        if self.buffers is None:
            return LayerCache(pick(self.self_k), pick(self.self_v), cross_k, cross_v, self.chunk)
        shape = (index.numel(), *self.buffers[0].shape[1:])
        spare = self.spare if self.spare is not None and self.spare[0].shape == shape else None
        if spare is None:
            spare = (self.buffers[0].new_empty(shape), self.buffers[1].new_empty(shape))
        for new, old in zip(spare, self.buffers):
            torch.index_select(old, 0, index, out=new)                   # (B', H, capacity, Dh)
        t = self.self_k.shape[2]
        out = LayerCache(spare[0][:, :, :t], spare[1][:, :, :t], cross_k, cross_v, self.chunk, spare, self.buffers)
        self.self_k = self.self_v = self.buffers = self.spare = None      # spent: buffers recycled
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
        """An empty cache like this one that writes keys/values in place into preallocated
        buffers and recycles them on ``reorder`` (faster search; not for tracing/export; a
        reordered cache's source is spent). Only valid before the first step."""
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
