"""Decoding speed-ups, applied to a model by :func:`prepare_for_decoding` and undone by :func:`restore`.

The model in :mod:`transduce.model` is the paper's, written to be read. Search runs the same
math faster by switching, in place, the classes of some of its modules (parameters, names and
the state dict stay as they are):

* :class:`FastAttention`: Q/K/V (or K/V) projections as one matmul, the fused weights kept
  between calls; keys/values shared by the beams of one sentence (:func:`fast_attention`); a
  few queries per row attended as two batched matmuls on CPU, where that beats the fused kernel.
* :class:`FastFeedForward`: the ReLU applied inside a oneDNN matmul.
* ``nn.Linear`` -> :class:`~transduce.inference.cpu.OneDNNLinear` on CPU; or dynamic int8.

A search (:func:`prepared`) prepares a plain model for its own duration; a
:class:`~transduce.inference.Translator` prepares its model once and restores it on ``close``.
The cache search uses is :class:`PooledKVCache` (:func:`new_cache`).

Legend: B query rows, Bk = B / g key/value rows, H heads, Tq/Tk query/key length, Dh head dim.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..model.attention import KVCache, MultiHeadAttention, scaled_dot_product_attention
from ..model.layers import FeedForward
from .cpu import OneDNNLinear, onednn_available, plain_linears, quantize_dynamic_int8

# Positions the pooled cache grows by at a time (see PooledLayerCache).
CACHE_CHUNK = 16
# Up to this many queries per row, CPU attention runs as two batched matmuls (_few_queries).
FEW_QUERIES = 8


def _few_queries(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
    """Eq. 1 as two batched matmuls over B*H: faster on CPU than the fused kernel for the few
    queries per row of incremental decoding (BENCHMARKS.md, "Decoding speed").

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


def repeat_shared_rows(b: int, k: Tensor, v: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor, Tensor | None]:
    """k, v and a mask of Bk rows, each shared by g = B / Bk consecutive query rows (see
    :func:`fast_attention`), repeated to B rows."""
    b_kv = k.shape[0]
    if b == b_kv:
        return k, v, mask
    g = b // b_kv
    k, v = k.repeat_interleave(g, dim=0), v.repeat_interleave(g, dim=0)
    if mask is not None and mask.shape[0] == b_kv:
        mask = mask.repeat_interleave(g, dim=0)
    return k, v, mask


def fast_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, dropout: float = 0.0,
    is_causal: bool = False, need_weights: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """:func:`~transduce.model.attention.scaled_dot_product_attention`, with keys/values that
    may be shared by groups of consecutive query rows (the beams of a sentence attending to its
    encoder output).

    With Bk = B / g rows of k, v and mask, query row i reads key row i // g. With one query per
    row (incremental decoding) the g queries of a group are attended as one row of g queries,
    which reads each key once instead of g times.

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
            out, weights = fast_attention(grouped, k, v, mask, dropout, False, need_weights)
            out = out.transpose(1, 2).reshape(b, h, 1, dh)
            if weights is not None:
                weights = weights.transpose(1, 2).reshape(b, h, 1, -1)
            return out, weights
        k, v, mask = repeat_shared_rows(b, k, v, mask)
    if (not need_weights and not is_causal and q.device.type == "cpu" and not dropout
            and q.shape[-2] <= FEW_QUERIES):
        return _few_queries(q, k, v, mask), None
    return scaled_dot_product_attention(q, k, v, mask, dropout, is_causal, need_weights)


class FastAttention(MultiHeadAttention):
    """:class:`~transduce.model.attention.MultiHeadAttention` with fused projections and
    :func:`fast_attention`. Only ever made by :func:`prepare_for_decoding` (a class switch)."""

    def _fused(self, names: tuple[str, ...]):
        """One linear layer computing the named projections side by side, or None.

        A single matmul of width 3D (or 2D) runs faster than three (two) of width D: it reads
        the input once and gives the kernels wider tiles. With gradients on, the weights are
        concatenated on each call, so autograd sees the real parameters. Without, the fused
        layer is kept and rebuilt only when a weight changes (storage or version counter); it
        has the class of ``q_proj`` (so a :class:`OneDNNLinear` stays one). Quantised layers
        are not fused.
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

    def project(self, x: Tensor, layers: tuple[nn.Linear, ...]) -> tuple[Tensor, ...]:
        """The model's side-by-side projection, with the fused layer kept between calls (or
        each layer on its own when they are not ``nn.Linear``: quantised)."""
        names = tuple(n for n in ("q_proj", "k_proj", "v_proj") if getattr(self, n) in layers)
        fused = self._fused(names)
        if fused is None:
            return tuple(self.split_heads(m(x)) for m in layers)
        return tuple(self.split_heads(t) for t in fused(x).chunk(len(layers), dim=-1))

    def project_kv(self, x: Tensor, start: int = 0) -> tuple[Tensor, Tensor]:
        """Keys and values, contiguous: they are projected once (the encoder output) and read
        at every step, which would otherwise copy the strided heads each time."""
        k, v = super().project_kv(x, start)
        return k.contiguous(), v.contiguous()

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, is_causal: bool = False,
               need_weights: bool = False, start: int = 0) -> tuple[Tensor, Tensor | None]:
        if self.pattern.kind != "full":  # local and Linformer attention keep the model's own path
            k, v, mask = repeat_shared_rows(q.shape[0], k, v, mask)
            return super().attend(q, k, v, mask, is_causal, need_weights, start)
        dropout = self.dropout if self.training else 0.0
        out, weights = fast_attention(q, k, v, mask, dropout, is_causal, need_weights)
        b, _, t, _ = out.shape
        return self.out_proj(out.transpose(1, 2).reshape(b, t, -1)), weights       # (B, Tq, D)


class FastFeedForward(FeedForward):
    """:class:`~transduce.model.layers.FeedForward` whose ReLU runs inside the first matmul's
    output loop when that layer is a :class:`OneDNNLinear` (one pass over (N, d_ff) fewer)."""

    def forward(self, x: Tensor) -> Tensor:
        if self.activation == "relu" and isinstance(self.fc1, OneDNNLinear):
            return self.fc2(self.dropout(self.fc1.forward_relu(x)))
        return super().forward(x)


_FAST = {MultiHeadAttention: FastAttention, FeedForward: FastFeedForward}
_PLAIN = {fast: plain for plain, fast in _FAST.items()}


def prepare_for_decoding(model: nn.Module, onednn: bool = False, int8: bool = False) -> nn.Module:
    """Switch ``model``'s modules to their decoding versions, in place; returns ``model``.

    Args:
        onednn: also run plain ``nn.Linear`` layers through oneDNN (CPU float32; same math,
            ``F.linear`` whenever gradients or autocast are on; a no-op without oneDNN).
        int8: quantise the linear layers to dynamic int8 first (CPU; see
            :func:`~transduce.inference.cpu.quantize_dynamic_int8`). Not undone by :func:`restore`.
    """
    if int8:
        quantize_dynamic_int8(model, inplace=True)
    switch_linears = onednn and not int8 and onednn_available()
    for module in model.modules():
        if type(module) in _FAST:
            module.__class__ = _FAST[type(module)]
        elif switch_linears and type(module) is nn.Linear:
            module.__class__ = OneDNNLinear
    return model


# Where :mod:`~transduce.inference.static` keeps a model's captured searches (and their memory).
STATIC_SEARCHES = "_static_searches"


def restore(model: nn.Module) -> nn.Module:
    """Undo :func:`prepare_for_decoding` and forget every kept copy of the weights (packed
    oneDNN weights, fused projections) and the captured static searches, in place; returns ``model``."""
    plain_linears(model)
    for module in model.modules():
        if type(module) in _PLAIN:
            module.__class__ = _PLAIN[type(module)]
        for name in ("_packed", "_fused_layers", STATIC_SEARCHES):
            module.__dict__.pop(name, None)
    return model


def is_prepared(model: nn.Module) -> bool:
    return any(isinstance(m, FastAttention) for m in model.modules())


@contextlib.contextmanager
def prepared(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` prepared for the block: one already prepared stays so; a plain one (or any
    Seq2Seq without attention modules) is prepared without oneDNN, and restored after."""
    if is_prepared(model):
        yield model
        return
    prepare_for_decoding(model)
    try:
        yield model
    finally:
        restore(model)


def new_cache(model: nn.Module):
    """The cache a search decodes with: a :class:`PooledKVCache` for a prepared model, else
    the model's own (``model.new_cache()``; also any cache that is not a KVCache, such as an
    ensemble's, which holds its members' own)."""
    cache = model.new_cache()
    return PooledKVCache.empty(len(cache.layers)) if is_prepared(model) and isinstance(cache, KVCache) else cache


@dataclass
class PooledLayerCache:
    """One decoder layer's keys and values for search; the interface of
    :class:`~transduce.model.attention.LayerCache`.

    Self-attention keys/values live in two preallocated flat pools used in turn. Without a
    pending reorder (greedy search, sampling) the entries sit in a pool laid out (B, H, room, Dh)
    with room to grow, and an append writes only the new positions, in place, until the room is
    used up; the keys are then the (B, H, t + T, Dh) slice (each head's rows contiguous). With
    one (a beam step), the append writes the old entries gathered by the reorder and the new ones
    into the other pool as one contiguous (B, H, t + T, Dh) tensor: one copy per tensor and no
    allocation. ``reorder`` is lazy (applied by the next append) and hands the pools to the new
    cache: the old one is spent. Cross-attention keys/values may be kept once per sentence (see
    :meth:`PooledKVCache.reorder`).
    """

    self_k: Tensor | None = None
    self_v: Tensor | None = None
    cross_k: Tensor | None = None
    cross_v: Tensor | None = None
    pools: tuple | None = None        # ((k, v) flat pool holding self_k/self_v, (k, v) the other)
    pending: Tensor | None = None     # (B',) rows to gather at the next append
    room: int = 0                     # positions per head of the layout self_k/self_v are the start of

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add new keys/values (B, H, T, Dh) after the cached ones -> all (B, H, t + T, Dh)."""
        t = 0 if self.self_k is None else self.self_k.shape[2]
        b, h, n_new, dh = k.shape
        if self.pending is None and self.self_k is not None and t + n_new <= self.room:  # in place
            views = []
            for pool, new in zip(self.pools[0], (k, v)):
                full = pool[:b * h * self.room * dh].view(b, h, self.room, dh)
                full[:, :, t:t + n_new] = new
                views.append(full[:, :, :t + n_new])
            self.self_k, self.self_v = views
            return self.self_k, self.self_v
        # a gather writes contiguous entries (its fast copy); otherwise leave room to grow in place
        room = t + n_new + (CACHE_CHUNK if self.pending is None else 0)
        need = b * h * room * dh
        current, other = self.pools if self.pools is not None else (None, None)
        if other is None or other[0].numel() < need:
            size = b * h * (t + n_new + CACHE_CHUNK) * dh
            other = (k.new_empty(size), k.new_empty(size))
        views = []
        for pool, old, new in zip(other, (self.self_k, self.self_v), (k, v)):
            full = pool[:need].view(b, h, room, dh)
            if old is not None and self.pending is not None:
                torch.index_select(old, 0, self.pending, out=full[:, :, :t])  # reorder + copy (contiguous)
            elif old is not None:
                full[:, :, :t] = old
            full[:, :, t:t + n_new] = new
            views.append(full[:, :, :t + n_new])
        self.self_k, self.self_v = views
        self.pools, self.pending, self.room = (other, current), None, room
        return self.self_k, self.self_v

    def reorder(self, index: Tensor, cross: Tensor | bool = True) -> "PooledLayerCache":
        """A cache holding batch rows ``index`` (B',) of this one; spends this one."""
        def pick(t: Tensor | None, rows: Tensor | None) -> Tensor | None:
            return t.index_select(0, rows) if (t is not None and rows is not None) else t

        cross_rows = index if cross is True else (None if cross is False else cross)
        cross_k, cross_v = pick(self.cross_k, cross_rows), pick(self.cross_v, cross_rows)
        if self.self_k is None:
            return PooledLayerCache(None, None, cross_k, cross_v)
        pending = index if self.pending is None else self.pending.index_select(0, index)
        out = PooledLayerCache(self.self_k, self.self_v, cross_k, cross_v, self.pools, pending)
        self.self_k = self.self_v = self.pools = self.pending = None       # spent: pools move on
        return out


@dataclass
class PooledKVCache:
    """The search cache: :class:`PooledLayerCache` per layer; the interface of
    :class:`~transduce.model.attention.KVCache`, plus rows of cross entries kept apart."""

    layers: list[PooledLayerCache]
    length: int = 0

    @classmethod
    def empty(cls, n_layers: int) -> "PooledKVCache":
        return cls([PooledLayerCache() for _ in range(n_layers)])

    def reorder(self, index: Tensor, cross: Tensor | bool = True) -> "PooledKVCache":
        """Select batch rows (beam reordering). index: (B',) long.

        ``cross`` says what happens to the cross-attention entries: ``True`` selects the same
        rows; ``False`` leaves them alone, valid when ``index`` only permutes rows that share a
        source sentence (beams of one sentence); a (B'',) tensor selects those rows instead, for
        cross entries kept once per sentence and shared by its beams (see :func:`fast_attention`).
        """
        return PooledKVCache([c.reorder(index, cross) for c in self.layers], self.length)
