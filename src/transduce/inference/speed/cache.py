"""The searches' key/value caches, both with the interface of the model's own
(:class:`~transduce.model.attention.KVCache`), so that ``model.decode`` is what runs:

* :class:`PooledKVCache`, the eager searches': preallocated pools reused across steps;
* :class:`StaticKVCache`, the static search's: buffers of a fixed size written at a position
  held on the device, so that a decoding step never changes shape nor reads a device value on
  the host, and a CUDA graph can replay it (:mod:`~transduce.inference.search.static_shapes`).

Legend: N rows (a sentence's K beams consecutive), B sentences, H heads, T positions (room),
S source positions, Dh head dim.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

# Positions the pooled cache grows by at a time (see PooledLayerCache).
CACHE_CHUNK = 16


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
    layout: tuple | None = None       # that layout: (B, H, room, Dh) views of pools[0] (k, v)
    key_mask = None                   # every entry is a position written so far (see LayerCache)

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add new keys/values (B, H, T, Dh) after the cached ones -> all (B, H, t + T, Dh)."""
        t = 0 if self.self_k is None else self.self_k.shape[2]
        b, h, n_new, dh = k.shape
        if self.pending is None and self.self_k is not None and t + n_new <= self.room:  # in place
            for full, new in zip(self.layout, (k, v)):
                full.narrow(2, t, n_new).copy_(new)
            self.self_k, self.self_v = (full.narrow(2, 0, t + n_new) for full in self.layout)
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
            views.append(full)
        self.layout = tuple(views)
        self.self_k, self.self_v = (full.narrow(2, 0, t + n_new) for full in views)
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
        self.self_k = self.self_v = self.pools = self.pending = self.layout = None  # spent: pools move on
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

    def key_length(self, new: int) -> int:
        """The keys self-attention sees once ``new`` positions are appended (as KVCache's)."""
        return self.length + new


@dataclass
class StaticLayerCache:
    """One decoder layer's keys and values in buffers of a fixed size; the interface of
    :class:`~transduce.model.attention.LayerCache` for one new position per step.

    ``append`` writes the new position's keys/values at ``length`` (a 0-dim tensor shared with
    the :class:`StaticKVCache`, indexed on the device, never read by the host) and returns the
    whole buffers; ``key_mask`` then shows the newest position the keys written so far (<= it)
    and hides the room after them. Cross-attention keys/values are loaded once per batch, one
    row per sentence, which its beams share (:func:`~transduce.inference.speed.fast_layers.fast_attention`).
    """

    self_k: Tensor                    # (N, H, T, Dh)
    self_v: Tensor
    cross_k: Tensor                   # (B, H, S, Dh)
    cross_v: Tensor
    length: Tensor                    # () the position the next append writes
    positions: Tensor                 # (T,) 0..T-1
    key_mask: Tensor | None = None    # (1, 1, 1, W) set by append
    window: int | None = None         # W: the first positions attended (None: all T)

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write new keys/values (N, H, 1, Dh) at ``length`` -> the buffers' first W positions
        (N, H, W, Dh) (W: ``window``, which must hold ``length``; all T without one)."""
        if k.shape[2] != 1:  # (several new positions would need a causal mask among them)
            raise ValueError(f"a static cache takes one new position per step; got {k.shape[2]}")
        at = self.length.view(1)
        self.self_k.index_copy_(2, at, k)
        self.self_v.index_copy_(2, at, v)
        keys, values, positions = self.self_k, self.self_v, self.positions
        if self.window is not None:
            w = self.window
            keys, values, positions = keys[:, :, :w], values[:, :, :w], positions[:w]
        self.key_mask = (positions <= self.length).view(1, 1, 1, -1)            # (1, 1, 1, W)
        return keys, values


@dataclass
class StaticKVCache:
    """The static search's cache: :class:`StaticLayerCache` per layer and the position they
    write at; the interface of :class:`~transduce.model.attention.KVCache`, whose ``length``
    here is a 0-dim device tensor that ``decode`` advances in place (``length += 1``)."""

    layers: list[StaticLayerCache]
    length: Tensor

    @classmethod
    def empty(cls, n_layers: int, self_shape: tuple[int, int, int, int], cross_shape: tuple[int, int, int, int],
              dtype: torch.dtype, device: torch.device) -> "StaticKVCache":
        """Zeroed buffers: self-attention ``self_shape`` (N, H, T, Dh), cross ``cross_shape`` (B, H, S, Dh)."""
        length = torch.zeros((), dtype=torch.long, device=device)
        positions = torch.arange(self_shape[2], device=device)
        layers = [StaticLayerCache(*(torch.zeros(shape, dtype=dtype, device=device)
                                     for shape in (self_shape, self_shape, cross_shape, cross_shape)),
                                   length, positions) for _ in range(n_layers)]
        return cls(layers, length)

    def key_length(self, new: int) -> int:
        """The keys self-attention sees: the window, or the whole buffer (its room hidden by the
        causal mask)."""
        layer = self.layers[0]
        return layer.self_k.shape[2] if layer.window is None else layer.window

    def attend_first(self, window: int | None) -> None:
        """Self-attention reads the first ``window`` positions from now on (None: all of them);
        the steps' positions must stay below it."""
        for layer in self.layers:
            layer.window = window

    def load(self, cross: list[tuple[Tensor, Tensor]]) -> None:
        """Start a batch at position 0: each layer's cross keys/values (b, H, s, Dh) into its
        first b rows and s positions, zeros elsewhere and in every self-attention entry (masked
        entries must still be finite: a masked NaN poisons the softmax)."""
        self.length.zero_()
        for layer in self.layers:
            for t in (layer.self_k, layer.self_v, layer.cross_k, layer.cross_v):
                t.zero_()
        for layer, (k, v) in zip(self.layers, cross):
            b, _, s, _ = k.shape
            layer.cross_k[:b, :, :s] = k
            layer.cross_v[:b, :, :s] = v

    def reorder(self, rows: Tensor) -> "StaticKVCache":
        """Self-attention rows ``rows`` (N,) of this cache, gathered in place (the beam each
        hypothesis continues); returns this cache. Cross entries stay: there is one per
        sentence, and beams move only among their sentence's rows."""
        for layer in self.layers:
            layer.self_k.copy_(layer.self_k.index_select(0, rows))
            layer.self_v.copy_(layer.self_v.index_select(0, rows))
        return self
