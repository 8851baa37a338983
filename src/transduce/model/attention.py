"""Scaled dot-product and multi-head attention (Sec. 3.2), with an explicit key/value cache.

A :class:`MultiHeadAttention` picks its kernel once, when it is built: :class:`FullAttention`
(Eq. 1, the paper) or, for long inputs, local attention (:mod:`~transduce.model.local_attention`),
Linformer (:mod:`~transduce.model.linformer`), BigBird (:mod:`~transduce.model.bigbird`) or
Reformer's LSH attention (:mod:`~transduce.model.lsh`).

Legend: B batch, H heads, Tq query length, Tk key length, D d_model, Dh head dim (D / H unless
set apart: Table 3 row (B), T5 1.1).
Masks are boolean, True = may attend (see :mod:`transduce.model.masks`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config.attention import AttentionConfig

from .bigbird import BigBirdAttention
from .embeddings import RotaryEmbedding
from .linformer import LinformerAttention
from .local_attention import LocalAttention
from .lsh import LSHAttention
from .masks import apply_mask, causal_mask, combine


def attention_weights(q: Tensor, k: Tensor, mask: Tensor | None = None, is_causal: bool = False,
                      scale: float | None = None) -> Tensor:
    """softmax(Q K^T / sqrt(d_k)) with masked keys set to -inf (Eq. 1). -> (B, H, Tq, Tk).
    ``scale`` replaces 1 / sqrt(d_k) (T5: 1); an additive ``mask`` is added to the scores."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = q @ k.transpose(-2, -1) * scale                             # (B, H, Tq, Tk)
    if is_causal:
        mask = combine(mask, causal_mask(q.shape[-2], k.shape[-2], q.device))
    if mask is not None:
        scores = apply_mask(scores, mask)
    return torch.softmax(scores.float(), dim=-1).to(q.dtype)


def scaled_dot_product_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, dropout: float = 0.0,
    is_causal: bool = False, need_weights: bool = False, scale: float | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V (Eq. 1).

    The fast path calls ``F.scaled_dot_product_attention`` (flash / memory-efficient kernels on
    CUDA); ``need_weights=True`` takes the explicit math path and also returns the weights.
    ``scale`` replaces 1 / sqrt(d_k) (None: the paper's). The mask is boolean or additive (a
    float tensor with a position bias, not combined with ``is_causal``: it holds the causal -inf).

    Shape: q (B, H, Tq, Dh), k and v (B, H, Tk, Dh), mask broadcastable to (B, H, Tq, Tk)
    -> output (B, H, Tq, Dh), weights (B, H, Tq, Tk) or None.
    """
    if not need_weights:
        if mask is not None and mask.is_floating_point():
            mask = mask.to(q.dtype)
        t_q, t_k = q.shape[-2], k.shape[-2]
        # SDPA takes a mask or is_causal, not both, and aligns is_causal top-left; we need
        # bottom-right alignment when the queries are the last Tq of Tk positions (cache).
        if is_causal and (mask is not None or t_q != t_k):
            mask = combine(mask, causal_mask(t_q, t_k, q.device))
            is_causal = False
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=is_causal,
                                             scale=scale)
        return out, None
    weights = attention_weights(q, k, mask, is_causal, scale)
    out = F.dropout(weights, dropout) @ v                               # (B, H, Tq, Dh)
    return out, weights


class FullAttention:
    """The paper's attention, Eq. 1 over every key: the kernel of ``model.attention="full"``,
    called by :meth:`MultiHeadAttention.attend` (``start`` does not apply). ``scale`` replaces
    1 / sqrt(d_k) (None: the paper's)."""

    def __init__(self, scale: float | None = None):
        self.scale = scale

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool, start: int,
                 dropout: float) -> Tensor:
        return scaled_dot_product_attention(q, k, v, mask, dropout, is_causal, scale=self.scale)[0]

    def with_weights(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool,
                     dropout: float) -> tuple[Tensor, Tensor]:
        return scaled_dot_product_attention(q, k, v, mask, dropout, is_causal, need_weights=True, scale=self.scale)


Kernel = FullAttention | LocalAttention | LinformerAttention | BigBirdAttention | LSHAttention


@dataclass
class LayerCache:
    """One decoder layer's cached keys and values: self-attention (B, H, T, Dh), growing by the
    new positions of each step, and cross-attention (B, H, S, Dh), projected once."""

    self_k: Tensor | None = None
    self_v: Tensor | None = None
    cross_k: Tensor | None = None
    cross_v: Tensor | None = None
    # The keys a cached position may see, as a key mask (True = may attend) over what ``append``
    # returns. None: this cache holds only positions written so far, each visible to the newest
    # (Sec. 3.2.3); a cache that reserves room for later positions must mask that room out.
    key_mask = None

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add new keys/values (B, H, T, Dh) after the cached ones -> all (B, H, t + T, Dh)."""
        if self.self_k is not None:
            k = torch.cat([self.self_k, k], dim=2)                       # (B, H, t + T, Dh)
            v = torch.cat([self.self_v, v], dim=2)
        self.self_k, self.self_v = k, v
        return k, v

    def reorder(self, index: Tensor) -> "LayerCache":
        """A cache holding batch rows ``index`` (B',) of this one."""
        def pick(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.index_select(0, index)
        return LayerCache(pick(self.self_k), pick(self.self_v), pick(self.cross_k), pick(self.cross_v))


@dataclass
class KVCache:
    """Key/value cache for incremental decoding, passed into and returned by ``decode``.

    Self-attention keys/values grow by one entry per step; cross-attention keys/values are
    computed from the encoder output once, on the first step, and reused after.
    """

    layers: list[LayerCache]
    length: int = 0

    @classmethod
    def empty(cls, n_layers: int) -> "KVCache":
        return cls([LayerCache() for _ in range(n_layers)])

    def reorder(self, index: Tensor) -> "KVCache":
        """Select batch rows (beam reordering / expansion). index: (B',) long."""
        return KVCache([c.reorder(index) for c in self.layers], self.length)

    def key_length(self, new: int) -> int:
        """The keys self-attention sees once ``new`` positions are appended (a position bias
        is computed for them before the layers run)."""
        return self.length + new


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O (Sec. 3.2.2).

    Used as self-attention (``forward(x, x, ...)``) and as encoder-decoder attention
    (queries from the decoder, keys/values from the encoder output).

    Args:
        d_model: model width D.
        n_heads: number of heads H (D must divide by H unless ``head_dim`` is given).
        dropout: dropout on attention weights.
        bias: whether the four projections have biases.
        rope: a rotary embedding applied to q and k (self-attention only), or None.
        pattern: which keys each query sees (full attention by default): one block's
            :class:`~transduce.config.attention.AttentionConfig`, its ``kind`` and ``window`` this
            block's and its ``seed`` this layer's (:func:`~transduce.model.layers.attention_pattern`);
            it picks the module's ``kernel`` once, here.
        scale: the factor of Q K^T, None for the paper's 1 / sqrt(Dh); T5's 1 (full attention only).
        head_dim: Dh, the width of each head (d_k = d_v); None for D / H (the paper). The
            projections then map D to H * Dh and W^O maps H * Dh back to D.
        max_len: the longest sequence: the span of Linformer's projections (``pattern.kind``
            linformer only).
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, bias: bool = True,
                 rope: RotaryEmbedding | None = None, pattern: AttentionConfig = AttentionConfig(),
                 scale: float | None = None, head_dim: int | None = None, max_len: int = 0):
        super().__init__()
        self.pattern = pattern
        self.scale = scale
        self.n_heads, self.head_dim = n_heads, d_model // n_heads if head_dim is None else head_dim
        self.dropout = dropout
        width = n_heads * self.head_dim                                   # H * Dh
        self.q_proj = nn.Linear(d_model, width, bias=bias)
        self.k_proj = nn.Linear(d_model, width, bias=bias)
        self.v_proj = nn.Linear(d_model, width, bias=bias)
        self.out_proj = nn.Linear(width, d_model, bias=bias)
        self.rope = rope
        self.kernel = self._kernel(pattern, max_len)

    def _kernel(self, pattern: AttentionConfig, max_len: int) -> Kernel:
        """The attention this module runs, chosen once: the one place that asks the kind."""
        if pattern.kind == "local":
            if pattern.global_projections:  # Longformer's query/key/value_global, parameters of this module
                width = self.n_heads * self.head_dim
                d_model, bias = self.q_proj.in_features, self.q_proj.bias is not None
                self.q_global_proj = nn.Linear(d_model, width, bias=bias)
                self.k_global_proj = nn.Linear(d_model, width, bias=bias)
                self.v_global_proj = nn.Linear(d_model, width, bias=bias)
            return LocalAttention(pattern.window, pattern.global_tokens)
        if pattern.kind == "bigbird":
            return BigBirdAttention(pattern.block, pattern.random_blocks, pattern.seed)
        if pattern.kind == "lsh":  # shared QK (Reformer Sec. 3): keys come from the query projection
            self.k_proj = self.q_proj
            return LSHAttention(pattern.block, pattern.lsh_hashes, pattern.lsh_buckets, pattern.seed)
        if pattern.kind == "linformer":  # E and F of Linformer's Eq. 7, parameters of this module
            self.e_proj = nn.Linear(max_len, pattern.linformer_k, bias=False)
            self.f_proj = nn.Linear(max_len, pattern.linformer_k, bias=False)
            return LinformerAttention(self.e_proj, self.f_proj)
        return FullAttention(self.scale)

    @property
    def is_full(self) -> bool:
        """Whether this module runs the paper's full attention (Eq. 1 over every key)."""
        return isinstance(self.kernel, FullAttention)

    def split_heads(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, Dh)

    def project(self, x: Tensor, layers: tuple[nn.Linear, ...]) -> tuple[Tensor, ...]:
        """x (B, T, D) through ``layers`` as one matmul with their weights side by side (as
        ``nn.MultiheadAttention``'s ``in_proj``: one read of x, wider tiles) -> (B, H, T, Dh) each."""
        w = torch.cat([m.weight for m in layers])                          # (n*H*Dh, D)
        b = torch.cat([m.bias for m in layers]) if layers[0].bias is not None else None
        return tuple(self.split_heads(t) for t in F.linear(x, w, b).chunk(len(layers), dim=-1))

    def project_kv(self, x: Tensor, start: int = 0) -> tuple[Tensor, Tensor]:
        """Keys and values of x (B, T, D) -> two (B, H, T, Dh), rotated if RoPE is on."""
        k, v = self.project(x, (self.k_proj, self.v_proj))
        return (self.rope(k, start) if self.rope is not None else k), v

    def project_qkv(self, x: Tensor, start: int = 0) -> tuple[Tensor, Tensor, Tensor]:
        """Queries, keys and values of x (B, T, D) for self-attention -> three (B, H, T, Dh)."""
        q, k, v = self.project(x, (self.q_proj, self.k_proj, self.v_proj))
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
        if kv is None and key_value is query:  # self-attention
            q, k, v = self.project_qkv(query, start)                     # (B, H, T, Dh)
            if self.pattern.global_projections and self.pattern.global_tokens and not need_weights:
                return self.with_global_rows(query, q, k, v, mask), None
        else:
            q = self.split_heads(self.q_proj(query))                     # (B, H, Tq, Dh)
            if self.rope is not None:
                q = self.rope(q, start)
            k, v = kv if kv is not None else self.project_kv(key_value, start)
        return self.attend(q, k, v, mask, is_causal, need_weights, start)

    def with_global_rows(self, x: Tensor, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """Longformer's self-attention (Beltagy et al., 2020, Sec. 3.1) of x (B, T, D) with its
        local heads q, k, v (B, H, T, Dh): the G global tokens' rows are full attention (Eq. 1)
        of their own projections (``q_global_proj``, ...) over every position; the other rows are
        this module's local kernel over q, k, v, the global tokens among its keys. -> (B, T, D)."""
        n = min(self.pattern.global_tokens, x.shape[1])
        qg = self.split_heads(self.q_global_proj(x[:, :n]))               # (B, H, n, Dh)
        kg, vg = self.split_heads(self.k_global_proj(x)), self.split_heads(self.v_global_proj(x))  # (B, H, T, Dh)
        rows = scaled_dot_product_attention(qg, kg, vg, mask, self.dropout if self.training else 0.0)[0]
        rows = self.out_proj(rows.transpose(1, 2).reshape(x.shape[0], n, -1))  # (B, n, D)
        if n == x.shape[1]:
            return rows
        band, _ = self.attend(q[:, :, n:], k, v, mask, start=n)           # (B, T - n, D)
        return torch.cat([rows, band], dim=1)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, is_causal: bool = False,
               need_weights: bool = False, start: int = 0) -> tuple[Tensor, Tensor | None]:
        """Attention of projected heads q (B, H, Tq, Dh) over k, v (B, H, Tk, Dh), then the
        output projection -> (B, Tq, D) and (B, H, Tq, Tk) weights if ``need_weights``.
        ``start`` is the position of the first query (local attention's band needs it)."""
        dropout = self.dropout if self.training else 0.0
        if need_weights:  # (only full attention has them: the others raise a ConfigError)
            out, weights = self.kernel.with_weights(q, k, v, mask, is_causal, dropout)
        else:
            out, weights = self.kernel(q, k, v, mask, is_causal, start, dropout), None
        b, _, t, _ = out.shape
        out = out.transpose(1, 2).reshape(b, t, -1)                      # (B, Tq, H*Dh)
        return self.out_proj(out), weights                               # (B, Tq, D)


def full_attention_only(model: nn.Module) -> bool:
    """Whether every attention module of ``model`` runs the paper's full attention, as chosen
    when it was built (what exports and static decoding need)."""
    return all(m.is_full for m in model.modules() if isinstance(m, MultiHeadAttention))
