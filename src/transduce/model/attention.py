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


def _few_query_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
    """Eq. 1 for a few queries per row (incremental decoding: one per row, or a group of
    beams) as two batched matmuls over B*H, several times faster on CPU than the flash kernel
    at this shape.

    Shape: q (B, H, Tq, Dh), k and v (B, H, Tk, Dh), mask broadcastable to (B, H, Tq, Tk)
    -> (B, H, Tq, Dh).
    """
    b, h, t_q, dh = q.shape
    t_k = k.shape[-2]
    scores = torch.bmm(q.reshape(b * h, t_q, dh), k.reshape(b * h, t_k, dh).transpose(1, 2))  # (BH, Tq, Tk)
    scores = scores.view(b, h, t_q, t_k).mul_(1.0 / math.sqrt(dh))
    if mask is not None:
        scores = scores.masked_fill_(~mask, float("-inf"))
    weights = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    return torch.bmm(weights.view(b * h, t_q, t_k), v.reshape(b * h, t_k, dh)).view(b, h, t_q, dh)


def scaled_dot_product_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, dropout: float = 0.0,
    is_causal: bool = False, need_weights: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V (Eq. 1).

    The fast path calls ``F.scaled_dot_product_attention`` (flash / memory-efficient kernels on
    CUDA); ``need_weights=True`` takes the explicit math path and also returns the weights.

    Keys/values may be shared by groups of consecutive query rows (beams of one sentence
    attending to its encoder output): with Bk = B / g rows of k, v and mask, query row i reads
    key row i // g. With one query per row (incremental decoding) the g queries of a group are
    then attended as one row of g queries, which reads each key once instead of g times.

    Shape: q (B, H, Tq, Dh), k and v (B or B/g, H, Tk, Dh), mask broadcastable to
    (B or B/g, H, Tq, Tk) -> output (B, H, Tq, Dh), weights (B, H, Tq, Tk) or None.
    """
    b, b_kv = q.shape[0], k.shape[0]
    if b != b_kv:
        if b % b_kv or (mask is not None and mask.shape[0] not in (1, b_kv)):
            raise ValueError(f"{b} query rows cannot share {b_kv} key/value rows")
        g = b // b_kv
        if q.shape[-2] == 1 and not is_causal:
            h, dh = q.shape[1], q.shape[-1]
            grouped = q.view(b_kv, g, h, dh).transpose(1, 2)                  # (Bk, H, g, Dh)
            out, weights = scaled_dot_product_attention(grouped, k, v, mask, dropout, False, need_weights)
            out = out.transpose(1, 2).reshape(b, h, 1, dh)
            if weights is not None:
                weights = weights.transpose(1, 2).reshape(b, h, 1, -1)
            return out, weights
        k, v = k.repeat_interleave(g, dim=0), v.repeat_interleave(g, dim=0)
        if mask is not None and mask.shape[0] == b_kv:
            mask = mask.repeat_interleave(g, dim=0)
    if not need_weights and not is_causal and q.device.type == "cpu" and not dropout and q.shape[-2] <= 8:
        return _few_query_attention(q, k, v, mask), None
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

    def reorder(self, index: Tensor, cross: Tensor | bool = True) -> "LayerCache":
        """A cache holding batch rows ``index`` (B',) of this one (see :meth:`KVCache.reorder`)."""
        def pick(t: Tensor | None, rows: Tensor | None = index) -> Tensor | None:
            return t.index_select(0, rows) if (t is not None and rows is not None) else t

        cross_rows = index if cross is True else (None if cross is False else cross)
        cross_k, cross_v = pick(self.cross_k, cross_rows), pick(self.cross_v, cross_rows)
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

    def reorder(self, index: Tensor, cross: Tensor | bool = True) -> "KVCache":
        """Select batch rows (beam reordering / expansion). index: (B',) long.

        ``cross`` says what happens to the cross-attention entries: ``True`` selects the same
        rows; ``False`` leaves them alone, valid when ``index`` only permutes rows that share a
        source sentence (beams of one sentence); a (B'',) tensor selects those rows instead, for
        cross entries kept once per sentence and shared by its beams (see
        :func:`scaled_dot_product_attention`).
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

    def _fused(self, names: tuple[str, ...]):
        """One linear layer computing the named projections side by side, or None.

        A single matmul of width 3D (or 2D) runs faster than three (two) of width D: it reads
        the input once and gives the kernels wider tiles. With gradients on, the weights are
        concatenated on each call, so autograd sees the real parameters. Without, the fused
        layer is kept and rebuilt only when a weight changes (storage or version counter); it
        has the class of ``q_proj``, so a faster ``nn.Linear`` subclass swapped in for
        inference (``transduce.inference.cpu``) is kept. Quantised layers are not fused.
        """
        mods = [getattr(self, n) for n in names]
        if not all(isinstance(m, nn.Linear) for m in mods):
            return None
        params = [m.weight for m in mods] + [m.bias for m in mods if m.bias is not None]

        def side_by_side() -> tuple[Tensor, Tensor | None]:
            return (torch.cat([m.weight for m in mods]),
                    torch.cat([m.bias for m in mods]) if mods[0].bias is not None else None)

        if (torch.is_grad_enabled() and any(p.requires_grad for p in params)) or any(p.is_inference() for p in params):
            # (inference tensors keep no version counter to tell when a kept copy is stale)
            w, b = side_by_side()
            return lambda x: F.linear(x, w, b)
        key = (names, type(mods[0])) + tuple((p.data_ptr(), p._version, p.dtype) for p in params)
        cached = self._fused_cache.get(names)
        if cached is None or cached[0] != key:
            with torch.inference_mode(False), torch.no_grad():
                w, b = side_by_side()
                fused = nn.Linear(w.shape[1], w.shape[0], bias=b is not None, device="meta")
                fused.weight = nn.Parameter(w, requires_grad=False)
                fused.bias = nn.Parameter(b, requires_grad=False) if b is not None else None
                fused.__class__ = type(mods[0])
            cached = self._fused_cache[names] = (key, fused)
        return cached[1]

    def __getstate__(self) -> dict:  # copies and pickles leave the fused layers behind
        state = self.__dict__.copy()
        state.pop("_fused_layers", None)
        return state

    @property
    def _fused_cache(self) -> dict:
        cache = self.__dict__.get("_fused_layers")
        if cache is None:  # a plain attribute: not a submodule, not in the state dict
            cache = self.__dict__["_fused_layers"] = {}
        return cache

    def project_kv(self, x: Tensor, start: int = 0) -> tuple[Tensor, Tensor]:
        """Keys and values of x (B, T, D) -> two (B, H, T, Dh), rotated if RoPE is on."""
        fused = self._fused(("k_proj", "v_proj"))
        if fused is None:
            k, v = self.k_proj(x), self.v_proj(x)
        else:
            k, v = fused(x).chunk(2, dim=-1)
        k, v = self.split_heads(k), self.split_heads(v)
        if self.rope is not None:
            k = self.rope(k, start)
        return k, v

    def project_qkv(self, x: Tensor, start: int = 0) -> tuple[Tensor, Tensor, Tensor]:
        """Queries, keys and values of x (B, T, D) for self-attention, from one matmul
        -> three (B, H, T, Dh), q and k rotated if RoPE is on."""
        fused = self._fused(("q_proj", "k_proj", "v_proj"))
        if fused is None:
            q, (k, v) = self.split_heads(self.q_proj(x)), self.project_kv(x, start)
            return (self.rope(q, start) if self.rope is not None else q), k, v
        q, k, v = (self.split_heads(t) for t in fused(x).chunk(3, dim=-1))
        if self.rope is not None:
            q, k = self.rope(q, start), self.rope(k, start)
        return q, k, v

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
        if kv is None and key_value is query:  # self-attention: one matmul for Q, K and V
            q, k, v = self.project_qkv(query, start)                     # (B, H, T, Dh)
        else:
            q = self.split_heads(self.q_proj(query))                     # (B, H, Tq, Dh)
            if self.rope is not None:
                q = self.rope(q, start)
            k, v = kv if kv is not None else self.project_kv(key_value, start)
        return self.attend(q, k, v, mask, is_causal, need_weights)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, is_causal: bool = False,
               need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """Attention of projected heads q (B, H, Tq, Dh) over k, v (B, H, Tk, Dh), then the
        output projection -> (B, Tq, D) and (B, H, Tq, Tk) weights if ``need_weights``."""
        dropout = self.dropout if self.training else 0.0
        out, weights = scaled_dot_product_attention(q, k, v, mask, dropout, is_causal, need_weights)
        b, _, t, _ = out.shape
        out = out.transpose(1, 2).reshape(b, t, -1)                      # (B, Tq, D)
        return self.out_proj(out), weights
