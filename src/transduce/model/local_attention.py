"""Local attention for long inputs: a sliding window plus global tokens (Longformer, Beltagy et
al., 2020, https://arxiv.org/abs/2004.05150, Sec. 3.1), as Eq. 1 under
:func:`~transduce.model.masks.local_mask`, in O(Tq * (W + G)) time and memory.

Two implementations of the same function, proven equal in tests/model/test_long_attention.py:

* :func:`blockwise_local_attention`, the reference: a loop over blocks of W queries, each
  attending to the keys its band can reach. It takes any input, and is what runs for the few
  queries of a decoding step.
* :func:`banded_local_attention`, the fast kernel: every block of every sentence at once, as one
  call of SDPA's fused kernel over overlapping strided key windows.

:func:`local_attention` chooses between them; :class:`LocalAttention` is the kernel a
:class:`~transduce.model.attention.MultiHeadAttention` of kind "local" runs.

Legend: B batch, H heads, Tq query length, Tk key length, Dh head dim, W window, G global tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import ConfigError
from .masks import local_mask


@dataclass(frozen=True)
class LocalAttention:
    """The kernel of ``model.attention="local"``: ``window`` positions each side (causal: before)
    and ``n_global`` global tokens. Called by :meth:`MultiHeadAttention.attend`."""

    window: int
    n_global: int = 0

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool, start: int,
                 dropout: float) -> Tensor:
        return local_attention(q, k, v, mask, self.window, self.n_global, is_causal, start, dropout)

    def with_weights(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool,
                     dropout: float) -> tuple[Tensor, Tensor]:
        raise ConfigError("model.attention: attention maps need full attention; this model has local attention")


def local_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, window: int, n_global: int = 0,
    is_causal: bool = False, start: int = 0, dropout: float = 0.0,
) -> Tensor:
    """Eq. 1 under :func:`~transduce.model.masks.local_mask`; no (Tq x Tk) tensor is ever made.

    Queries of global positions attend to every key (whole rows, O(G * Tk)); the others take
    the fast kernel when they span more than one block and it applies, else the reference loop.

    Args:
        mask: a key mask broadcastable to (B, H, 1, Tk) (padding), or (B, H, Tq, Tk), or None.
        start: position of the first query; keys are at positions 0..Tk-1 (with a cache, the
            queries are the last Tq of Tk positions: ``start = Tk - Tq``). Without ``is_causal``
            (cross-attention) a query past the last key stands at the last key's position.

    Shape: q (B, H, Tq, Dh), k and v (B, H, Tk, Dh) -> (B, H, Tq, Dh).
    """
    t_q, t_k = q.shape[-2], k.shape[-2]
    n_rows = min(max(n_global - start, 0), t_q)  # queries that are global tokens
    fast = t_q - n_rows > window and (mask is None or mask.shape[-2] == 1) and (is_causal or start + t_q <= t_k)
    if not fast:
        return blockwise_local_attention(q, k, v, mask, window, n_global, is_causal, start, dropout)
    band = banded_local_attention(q[:, :, n_rows:], k, v, mask, window, n_global, is_causal, start + n_rows, dropout)
    if not n_rows:
        return band
    rows = blockwise_local_attention(q[:, :, :n_rows], k, v, mask, window, n_global, is_causal, start, dropout)
    return torch.cat([rows, band], dim=2)


# The reference: a loop over blocks of queries.

def blockwise_local_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, window: int, n_global: int = 0,
    is_causal: bool = False, start: int = 0, dropout: float = 0.0,
) -> Tensor:
    """:func:`local_attention` as a loop: the queries go in blocks of ``window``; each block
    attends only to the keys its band can reach, sliced out of k and v, plus the global keys
    as extra columns, under the band mask. The global queries are one block over all keys.

    Takes every input :func:`local_attention` does (same arguments, same shapes).
    """
    outs = []
    for a, b, lo, hi in _blocks(q.shape[-2], k.shape[-2], window, n_global, is_causal, start):
        g = min(n_global, lo)  # global keys left of the slice, added as extra columns
        k_pos = torch.arange(lo, hi, device=q.device)
        kb, vb = k[:, :, lo:hi], v[:, :, lo:hi]                          # (B, H, hi - lo, Dh)
        if g:
            k_pos = torch.cat([torch.arange(g, device=q.device), k_pos])
            kb, vb = torch.cat([k[:, :, :g], kb], dim=2), torch.cat([v[:, :, :g], vb], dim=2)
        q_pos = torch.arange(start + a, start + b, device=q.device)
        m = local_mask(q_pos if is_causal else q_pos.clamp(max=k.shape[-2] - 1), k_pos, window, n_global, is_causal)
        if mask is not None:
            m = m & (mask if mask.shape[-2] == 1 else mask[..., a:b, :]).index_select(-1, k_pos)
        outs.append(F.scaled_dot_product_attention(q[:, :, a:b], kb, vb, attn_mask=m, dropout_p=dropout))
    return torch.cat(outs, dim=2)                                         # (B, H, Tq, Dh)


def _blocks(t_q: int, t_k: int, window: int, n_global: int, is_causal: bool, start: int) -> list[tuple[int, ...]]:
    """The query blocks [a, b) and the key slices [lo, hi) their bands reach: first the global
    queries (every key; causal: up to their own position), then blocks of ``window``."""
    n_rows = min(max(n_global - start, 0), t_q)
    spans = [(0, n_rows, 0, min(t_k, start + n_rows) if is_causal else t_k)] if n_rows else []
    for a in range(n_rows, t_q, window):
        b = min(a + window, t_q)
        if is_causal:
            lo, hi = max(0, start + a - window), min(t_k, start + b)
        else:  # (queries past the last key, in cross-attention, stand at the last key)
            lo, hi = max(0, min(start + a, t_k - 1) - window), min(t_k, min(start + b - 1, t_k - 1) + window + 1)
        spans.append((a, b, lo, hi))
    return spans


# The fast kernel: every block at once.

@dataclass(frozen=True)
class _Band:
    """Where :func:`banded_local_attention` puts things. Each sentence's queries and keys are
    copied into a flat buffer of ``n`` blocks of W rows: the ``nb`` query blocks, plus one block
    of the keys before ``start`` and one of the keys past the last query block, where they exist.
    Block i's key window is buffer rows i*W .. i*W + span (with W rows of zeros in front), i.e.
    key positions first + (i mod n - 1) * W + 0..span-1 of its sentence."""

    b: int           # sentences
    t_q: int
    t_k: int
    w: int           # window W, also the block size
    n_global: int
    causal: bool
    start: int       # position of the first query
    nb: int          # query blocks
    span: int        # keys in a block's window: 3W (causal: 2W)
    before: int      # 1 if a block of keys before ``start`` leads the buffer
    n: int           # blocks per sentence
    first: int       # key position at a sentence's buffer row 0
    lo: int          # key rows lo..hi are copied into the buffer
    hi: int

    @classmethod
    def of(cls, q: Tensor, k: Tensor, window: int, n_global: int, causal: bool, start: int) -> "_Band":
        t_q, t_k, w = q.shape[-2], k.shape[-2], window
        nb = -(-t_q // w)
        before = int(start > 0)
        after = int(not causal and start + nb * w < t_k)  # a block of keys past the last query block
        n, first = before + nb + after, start - before * w
        return cls(q.shape[0], t_q, t_k, w, n_global, causal, start, nb, (2 if causal else 3) * w, before, n,
                   first, max(first, 0), min(first + n * w, t_k))


def banded_local_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, window: int, n_global: int = 0,
    is_causal: bool = False, start: int = 0, dropout: float = 0.0,
) -> Tensor:
    """:func:`local_attention` of queries none of which is global nor past the last key, as one
    4-D SDPA call that the fused (flash) CPU kernel takes: block j of W queries over its window
    of 3W keys (causal 2W), plus the global keys as extra columns, the band as a mask.

    The key windows of all blocks of all sentences are one overlapping strided view of a flat
    buffer (:class:`_Band`): no copy per window, and the (B * n) blocks are the batch of the
    fused kernel, whose memory for the backward pass is O(T) (it keeps the log-sum-exp, not the
    weights). Blocks that only carry a halo are computed and dropped. SDPA's fused CPU kernels
    refuse dropout on the weights (``model.attention_dropout`` > 0): then SDPA takes its math
    kernel, which keeps them.

    Shape: q (B, H, Tq, Dh), k and v (B, H, Tk, Dh), mask (B, 1, 1, Tk) or None -> (B, H, Tq, Dh).
    """
    past_keys = not is_causal and start + q.shape[-2] > k.shape[-2]
    if start < n_global or past_keys or (mask is not None and mask.shape[-2] != 1):
        raise ValueError("banded_local_attention: global queries, queries past the last key or a per-query mask; "
                         "use local_attention")
    g = _Band.of(q, k, window, n_global, is_causal, start)
    mask = _unless_all_true(mask, g)
    k_buf, v_buf = _key_buffer(k, g), _key_buffer(v, g)                   # (W + B*n*W + W, H, Dh)
    qb = _query_blocks(q, g)                                               # (B*n, H, W, Dh)
    band = _band_mask(g, q.device)                                         # (W, span)
    keys, g_keys = _window_keys(g, mask, q.device)                         # (B*n, span), (B*n, G)
    groups = _groups(g, mask)
    outs = []
    for a, c, shared in groups:
        kb, vb = _windows(k_buf, g, a, c), _windows(v_buf, g, a, c)        # (c - a, H, span, Dh)
        if n_global:  # (one group: all blocks)
            kb, vb = _with_global(k, kb, g), _with_global(v, vb, g)        # (B*n, H, G + span, Dh)
        m = band[None, None] if shared else _block_mask(band, keys, g_keys, a, c)
        outs.append(F.scaled_dot_product_attention(qb[a:c], kb, vb, attn_mask=m, dropout_p=dropout))
    return _from_blocks(outs, g, groups[0][0])


def _unless_all_true(mask: Tensor | None, g: _Band) -> Tensor | None:
    """None for a key mask that hides nothing in one sentence (the encoder passes one even where
    nothing is padded): then the blocks can share one mask (:func:`_groups`)."""
    if (g.b == 1 and mask is not None and not g.n_global and not torch.jit.is_tracing()
            and not torch.compiler.is_compiling() and bool(mask.all())):
        return None
    return mask


def _buffer(x: Tensor, g: _Band, lo: int, hi: int, at: int) -> Tensor:
    """Rows lo..hi of x (B, H, T, Dh) into zeros (B * n * W, H, Dh): sentence s's n * W rows
    from s * n * W on, row lo at offset ``at`` in them."""
    b, h, _, dh = x.shape
    buf = x.new_zeros(b, g.n * g.w, h, dh)
    buf[:, at:at + hi - lo] = x[:, :, lo:hi].transpose(1, 2)
    return buf.view(b * g.n * g.w, h, dh)


def _key_buffer(x: Tensor, g: _Band) -> Tensor:
    """Keys (or values) in the buffer, with the W rows of zeros in front of block 0's window and
    W after the last's -> (W + B * n * W + W, H, Dh)."""
    return F.pad(_buffer(x, g, g.lo, g.hi, g.lo - g.first), (0, 0, 0, 0, g.w, g.w))


def _query_blocks(q: Tensor, g: _Band) -> Tensor:
    """Queries in the buffer, one block of W per batch row -> (B * n, H, W, Dh)."""
    b, h, _, dh = q.shape
    return _buffer(q, g, 0, g.t_q, g.before * g.w).view(b * g.n, g.w, h, dh).transpose(1, 2)


def _windows(buf: Tensor, g: _Band, a: int, c: int) -> Tensor:
    """The key windows of buffer blocks a..c, a strided view of ``buf`` -> (c - a, H, span, Dh).
    (A view of the rows they cover, not a slice of all windows: the backward pass of a slice
    would build a gradient for every window.)"""
    return buf[a * g.w:(c - 1) * g.w + g.span].unfold(0, g.span, g.w).permute(0, 1, 3, 2)


def _with_global(x: Tensor, windows: Tensor, g: _Band) -> Tensor:
    """The global keys (or values) of x (B, H, Tk, Dh) as extra columns in front of every
    block's window (band queries see them all) -> (B * n, H, G + span, Dh)."""
    return torch.cat([x[:, :, :g.n_global].repeat_interleave(g.n, 0), windows], dim=-2)


def _band_mask(g: _Band, device: torch.device) -> Tensor:
    """The (W x span) band, the same in every block: query i sits at window row W + i."""
    return local_mask(torch.arange(g.w, device=device) + g.w, torch.arange(g.span, device=device), g.w, 0,
                      g.causal)[0, 0]


def _window_keys(g: _Band, mask: Tensor | None, device: torch.device) -> tuple[Tensor, Tensor | None]:
    """Which keys each block may see besides the band: those of its window that exist
    (positions in [G, Tk), not padded) -> (B * n, span), and the global keys (not padded)
    -> (B * n, G), or None without global tokens. Halo-only blocks see everything."""
    blk = torch.arange(g.n, device=device) - g.before                      # block index of each buffer block
    k_pos = g.start + (blk[:, None] - 1) * g.w + torch.arange(g.span, device=device)  # (n, span)
    halo = ((blk < 0) | (blk >= g.nb))[:, None].repeat(g.b, 1)            # (B*n, 1)
    keys = ((k_pos >= g.n_global) & (k_pos < g.t_k)).repeat(g.b, 1) | halo  # (B*n, span)
    if mask is not None:  # key padding, per sentence: its positions in the same windows
        pad_keys = F.pad(mask.reshape(g.b, g.t_k)[:, g.lo:g.hi], (g.lo - g.first, g.first + g.n * g.w - g.hi),
                         value=False)
        pad_keys = F.pad(pad_keys.reshape(-1), (g.w, g.w), value=False).unfold(0, g.span, g.w)[:g.b * g.n]
        keys = keys & (pad_keys | halo)
    if not g.n_global:
        return keys, None
    if mask is None:
        return keys, torch.ones(g.b * g.n, g.n_global, dtype=torch.bool, device=device)
    return keys, mask.reshape(g.b, g.t_k)[:, :g.n_global].repeat_interleave(g.n, 0) | halo


def _block_mask(band: Tensor, keys: Tensor, g_keys: Tensor | None, a: int, c: int) -> Tensor:
    """The mask of buffer blocks a..c -> (c - a, 1, W, [G +] span)."""
    m = band & keys[a:c, None, :]                                          # (c - a, W, span)
    if g_keys is not None:
        m = torch.cat([g_keys[a:c, None, :].expand(-1, band.shape[0], -1), m], dim=-1)
    return m[:, None]


def _groups(g: _Band, mask: Tensor | None) -> list[tuple[int, int, bool]]:
    """The buffer blocks a..c that go to one kernel call, and whether they share the band as
    their mask. With one sentence, no padding and no global keys, the blocks whose windows lie
    inside [0, Tk) all have the same mask, so they share one instead of one each (the fused
    kernel keeps its mask, as floats, for the backward pass: 3x the size of q otherwise); the
    edge blocks go on their own, the halo-only blocks are left out."""
    everything = [(0, g.b * g.n, False)]
    if g.b != 1 or mask is not None or g.n_global:
        return everything
    i0 = min(max(g.before, -(-(g.w - g.first) // g.w)), g.before + g.nb)    # first block with keys >= 0
    i1 = max(min(g.before + g.nb, (g.t_k - g.span - g.first) // g.w + 2), i0)  # past the last with keys < Tk
    if i1 <= i0:
        return everything
    return [(a, c, s) for a, c, s in ((g.before, i0, False), (i0, i1, True), (i1, g.before + g.nb, False)) if c > a]


def _from_blocks(outs: list[Tensor], g: _Band, a0: int) -> Tensor:
    """The kernel's outputs for buffer blocks a0.. (each (blocks, H, W, Dh)) back to (B, H, Tq, Dh),
    without the halo blocks' rows."""
    out = torch.cat(outs) if len(outs) > 1 else outs[0]                   # (B*n or fewer, H, W, Dh)
    _, h, _, dh = out.shape
    skip = (g.before - a0) * g.w                                           # rows of dropped halo blocks
    out = out.transpose(1, 2).reshape(g.b, -1, h, dh)[:, skip:skip + g.t_q]
    return out.transpose(1, 2)                                             # (B, H, Tq, Dh)
