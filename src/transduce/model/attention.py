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

from ..errors import ConfigError
from .embeddings import RotaryEmbedding
from .masks import causal_mask, combine, local_mask


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


def local_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, window: int, n_global: int = 0,
    is_causal: bool = False, start: int = 0, dropout: float = 0.0,
) -> Tensor:
    """Eq. 1 under :func:`~transduce.model.masks.local_mask`, in O(Tq * (W + G)) time and memory.

    The queries go in blocks of ``window``; each block attends only to the keys that its band can
    reach, [block start - W, block end + W) (causal: up to the block end), sliced out of k and v,
    plus the ``n_global`` first keys as extra columns. Queries of global positions attend to
    every key (whole rows, O(G * Tk)). No (Tq x Tk) tensor is ever made.

    Args:
        mask: a key mask broadcastable to (B, H, 1, Tk) (padding), or (B, H, Tq, Tk), or None.
        start: position of the first query; keys are at positions 0..Tk-1 (with a cache, the
            queries are the last Tq of Tk positions: ``start = Tk - Tq``). Without ``is_causal``
            (cross-attention) a query past the last key stands at the last key's position.

    Shape: q (B, H, Tq, Dh), k and v (B, H, Tk, Dh) -> (B, H, Tq, Dh).
    """
    t_q, t_k = q.shape[-2], k.shape[-2]
    n_rows = min(max(n_global - start, 0), t_q)  # queries that are global tokens
    spans = [(0, n_rows, 0, min(t_k, start + n_rows) if is_causal else t_k)] if n_rows else []
    if t_q - n_rows > window and (mask is None or mask.shape[-2] == 1) and (is_causal or start + t_q <= t_k):
        # many blocks: all at once (one kernel call instead of one per block)
        band = _band_blocks(q[:, :, n_rows:], k, v, mask, window, n_global, is_causal, start + n_rows, dropout)
        if not n_rows:
            return band
        return torch.cat([local_attention(q[:, :, :n_rows], k, v, mask, window, n_global, is_causal, start,
                                          dropout), band], dim=2)
    for a in range(n_rows, t_q, window):
        b = min(a + window, t_q)
        if is_causal:
            lo, hi = max(0, start + a - window), min(t_k, start + b)
        else:  # (queries past the last key, in cross-attention, stand at the last key)
            lo, hi = max(0, min(start + a, t_k - 1) - window), min(t_k, min(start + b - 1, t_k - 1) + window + 1)
        spans.append((a, b, lo, hi))
    outs = []
    for a, b, lo, hi in spans:
        g = min(n_global, lo)  # global keys left of the slice, added as extra columns
        k_pos = torch.arange(lo, hi, device=q.device)
        kb, vb = k[:, :, lo:hi], v[:, :, lo:hi]                          # (B, H, hi - lo, Dh)
        if g:
            k_pos = torch.cat([torch.arange(g, device=q.device), k_pos])
            kb, vb = torch.cat([k[:, :, :g], kb], dim=2), torch.cat([v[:, :, :g], vb], dim=2)
        q_pos = torch.arange(start + a, start + b, device=q.device)
        m = local_mask(q_pos if is_causal else q_pos.clamp(max=t_k - 1), k_pos, window, n_global, is_causal)
        if mask is not None:
            m = m & (mask if mask.shape[-2] == 1 else mask[..., a:b, :]).index_select(-1, k_pos)
        outs.append(scaled_dot_product_attention(q[:, :, a:b], kb, vb, m, dropout)[0])  # (B, H, b - a, Dh)
    return torch.cat(outs, dim=2)


def _band_blocks(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, window: int, n_global: int,
                 is_causal: bool, start: int, dropout: float) -> Tensor:
    """:func:`local_attention` of queries none of which is global nor past the last key, as
    one 4-D SDPA call that the fused (flash) CPU kernel takes: block j of W queries over its
    window of 3W keys (causal 2W), plus the global keys as extra columns, the band as a mask.

    Every sentence's queries and keys are copied once into a flat buffer of ``n`` blocks of W
    (the nb query blocks, plus one block of the keys before ``start`` and one of the keys past
    the last query block, where they exist), so that the key windows of all blocks of all
    sentences are one overlapping strided view (block i's window starts i*W rows in): no copy
    per window, and the (B * n) blocks are the batch of the fused kernel, whose memory for the
    backward pass is O(T) (it keeps the log-sum-exp, not the weights). Blocks that only carry a
    halo are computed and dropped. SDPA's fused CPU kernels refuse dropout on the weights
    (``model.attention_dropout`` > 0): then SDPA takes its math kernel, which keeps them.

    Shape: q (B, H, Tq, Dh), k and v (B, H, Tk, Dh), mask (B, 1, 1, Tk) or None -> (B, H, Tq, Dh).
    """
    b, h, t_q, dh = q.shape
    t_k, w, dev = k.shape[-2], window, q.device
    nb, span = -(-t_q // w), (2 if is_causal else 3) * w
    if (b == 1 and mask is not None and not n_global and not torch.jit.is_tracing()
            and not torch.compiler.is_compiling() and bool(mask.all())):
        mask = None  # (the encoder passes a key mask even where nothing is padded: see below)
    before = int(start > 0)                             # a block of keys before the first query
    after = int(not is_causal and start + nb * w < t_k)  # a block of keys past the last query block
    n = before + nb + after
    first = start - before * w                          # key position at a sentence's buffer row 0

    def flat(x: Tensor, lo: int, hi: int, at: int, pad: int) -> Tensor:
        """Rows lo..hi of x (B, H, T, Dh) into zeros (pad + B * n * W + pad, H, Dh), sentence
        s's n * W rows from pad + s * n * W on, row lo at offset ``at`` in them."""
        buf = x.new_zeros(b, n * w, h, dh)
        buf[:, at:at + hi - lo] = x[:, :, lo:hi].transpose(1, 2)
        return F.pad(buf.view(b * n * w, h, dh), (0, 0, 0, 0, pad, pad)) if pad else buf.view(b * n * w, h, dh)

    lo, hi = max(first, 0), min(first + n * w, t_k)
    # window of block i (all sentences) = buffer rows i*W .. i*W + span, i.e. key positions
    # first + (i mod n - 1) * W + 0..span-1 of its sentence (the W rows of zeros in front)
    k_buf, v_buf = flat(k, lo, hi, lo - first, w), flat(v, lo, hi, lo - first, w)

    def windows(buf: Tensor, a: int, c: int) -> Tensor:
        """The key windows of blocks a..c, a strided view of ``buf`` -> (c - a, H, span, Dh).
        (A view of the rows they cover, not a slice of all windows: the backward pass of a
        slice would build a gradient for every window.)"""
        return buf[a * w:(c - 1) * w + span].unfold(0, span, w).permute(0, 1, 3, 2)

    qb = flat(q, 0, t_q, before * w, 0).view(b * n, w, h, dh).transpose(1, 2)             # (B*n, H, W, Dh)

    # The band is the same (W x span) pattern in every block (query i sits at window row W + i);
    # blocks differ only in which window keys exist (positions in [G, Tk), not padded)
    band = local_mask(torch.arange(w, device=dev) + w, torch.arange(span, device=dev), w, 0, is_causal)[0, 0]
    blk = torch.arange(n, device=dev) - before                             # block index of each buffer block
    k_pos = start + (blk[:, None] - 1) * w + torch.arange(span, device=dev)  # (n, span)
    halo = ((blk < 0) | (blk >= nb))[:, None]                              # halo-only blocks: see anything
    keys = ((k_pos >= n_global) & (k_pos < t_k) | halo).repeat(b, 1)       # (B*n, span)
    if mask is not None:  # key padding, per sentence: its positions in the same windows
        pad_keys = F.pad(mask.reshape(b, t_k)[:, lo:hi], (lo - first, first + n * w - hi), value=False)
        pad_keys = F.pad(pad_keys.reshape(-1), (w, w), value=False).unfold(0, span, w)[:b * n]  # (B*n, span)
        keys = keys & (pad_keys | halo.repeat(b, 1))
    g_keys = None
    if n_global:  # the global keys, as extra columns of every block (band queries see them all)
        g_keys = torch.ones(b * n, n_global, dtype=torch.bool, device=dev)
        if mask is not None:
            g_keys = mask.reshape(b, t_k)[:, :n_global].repeat_interleave(n, 0) | halo.repeat(b, 1)
        kg, vg = (x[:, :, :n_global].repeat_interleave(n, 0) for x in (k, v))  # (B*n, H, G, Dh)
        kb, vb = torch.cat([kg, windows(k_buf, 0, b * n)], dim=-2), torch.cat([vg, windows(v_buf, 0, b * n)], dim=-2)

    def block_mask(a: int, c: int) -> Tensor:
        """The mask of buffer blocks a..c -> (c - a, 1, W, [G +] span)."""
        m = band & keys[a:c, None, :]                                      # (c - a, W, span)
        if g_keys is not None:
            m = torch.cat([g_keys[a:c, None, :].expand(-1, w, -1), m], dim=-1)
        return m[:, None]

    # One sequence, no padding, no global keys: the blocks whose windows lie inside [0, Tk) all
    # have the same band, so they share one (W x span) mask instead of one each (the fused
    # kernel keeps its mask, as floats, for the backward pass: 3x the size of q otherwise)
    groups = [(0, b * n, False)]
    if b == 1 and mask is None and not n_global:
        i0 = min(max(before, -(-(w - first) // w)), before + nb)           # first block with keys >= 0
        i1 = max(min(before + nb, (t_k - span - first) // w + 2), i0)      # past the last with keys < Tk
        if i1 > i0:
            groups = [(a, c, shared) for a, c, shared in ((before, i0, False), (i0, i1, True),
                                                          (i1, before + nb, False)) if c > a]
    def kv(a: int, c: int) -> tuple[Tensor, Tensor]:
        if n_global:  # (one group, all blocks)
            return kb, vb
        return windows(k_buf, a, c), windows(v_buf, a, c)

    outs = [F.scaled_dot_product_attention(qb[a:c], *kv(a, c), dropout_p=dropout,
                                           attn_mask=band[None, None] if shared else block_mask(a, c))
            for a, c, shared in groups]                                    # (blocks, H, W, Dh)
    out = torch.cat(outs) if len(outs) > 1 else outs[0]
    skip = (before - groups[0][0]) * w                                     # rows of dropped halo blocks
    out = out.transpose(1, 2).reshape(b, -1, h, dh)[:, skip:skip + t_q]
    return out.transpose(1, 2)                                             # (B, H, Tq, Dh)


@dataclass(frozen=True)
class AttentionPattern:
    """Which keys a query sees: "full" (the paper), "local" (``window`` positions each side and
    ``n_global`` global tokens, :func:`local_attention`) or "linformer" (keys and values
    projected along the sequence to ``linformer_k`` rows by learned (k x ``max_len``) matrices;
    Wang et al., 2020, https://arxiv.org/abs/2006.04768, Eq. 7, one E and F per layer shared
    by the heads)."""

    kind: str = "full"
    window: int = 0
    n_global: int = 0
    linformer_k: int = 0
    max_len: int = 0


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
        pattern: which keys each query sees (full attention by default).
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, bias: bool = True,
                 rope: RotaryEmbedding | None = None, pattern: AttentionPattern = AttentionPattern()):
        super().__init__()
        self.pattern = pattern
        self.n_heads, self.head_dim = n_heads, d_model // n_heads
        self.dropout = dropout
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self.rope = rope
        if pattern.kind == "linformer":  # E and F of Linformer's Eq. 7, applied along the sequence
            self.e_proj = nn.Linear(pattern.max_len, pattern.linformer_k, bias=False)
            self.f_proj = nn.Linear(pattern.max_len, pattern.linformer_k, bias=False)

    def split_heads(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, Dh)

    def project(self, x: Tensor, layers: tuple[nn.Linear, ...]) -> tuple[Tensor, ...]:
        """x (B, T, D) through ``layers`` as one matmul with their weights side by side (as
        ``nn.MultiheadAttention``'s ``in_proj``: one read of x, wider tiles) -> (B, H, T, Dh) each."""
        w = torch.cat([m.weight for m in layers])                          # (n*D, D)
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
        else:
            q = self.split_heads(self.q_proj(query))                     # (B, H, Tq, Dh)
            if self.rope is not None:
                q = self.rope(q, start)
            k, v = kv if kv is not None else self.project_kv(key_value, start)
        return self.attend(q, k, v, mask, is_causal, need_weights, start)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, is_causal: bool = False,
               need_weights: bool = False, start: int = 0) -> tuple[Tensor, Tensor | None]:
        """Attention of projected heads q (B, H, Tq, Dh) over k, v (B, H, Tk, Dh), then the
        output projection -> (B, Tq, D) and (B, H, Tq, Tk) weights if ``need_weights``.
        ``start`` is the position of the first query (local attention's band needs it)."""
        dropout = self.dropout if self.training else 0.0
        p = self.pattern
        if p.kind != "full" and need_weights:
            raise ConfigError(f"model.attention: attention maps need full attention; this model has {p.kind} attention")
        if p.kind == "local":
            out, weights = local_attention(q, k, v, mask, p.window, p.n_global, is_causal, start, dropout), None
        elif p.kind == "linformer":
            k, v = self.linformer_project(k, v, mask)                    # (B, H, k, Dh)
            out, weights = scaled_dot_product_attention(q, k, v, None, dropout)
        else:
            out, weights = scaled_dot_product_attention(q, k, v, mask, dropout, is_causal, need_weights)
        b, _, t, _ = out.shape
        out = out.transpose(1, 2).reshape(b, t, -1)                      # (B, Tq, D)
        return self.out_proj(out), weights

    def linformer_project(self, k: Tensor, v: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
        """E K and F V (Linformer Eq. 7) over the first S columns of E and F; padded keys and
        values are zeroed first, so that they add nothing and need no mask after.

        Shape: k, v (B, H, S, Dh), mask (B, 1, 1, S) key mask or None -> two (B, H, k, Dh).
        """
        s, max_len = k.shape[-2], self.e_proj.in_features
        if s > max_len:
            raise ConfigError(f"model.max_positions: linformer attention spans {max_len} positions; got {s}")
        if mask is not None:
            keep = mask.transpose(-2, -1)                                 # (B, 1, S, 1)
            k, v = k.masked_fill(~keep, 0.0), v.masked_fill(~keep, 0.0)
        return self.e_proj.weight[:, :s] @ k, self.f_proj.weight[:, :s] @ v   # (k, S) @ (B, H, S, Dh)
