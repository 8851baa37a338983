"""A key/value cache that rows join and leave between decoding steps (continuous batching).

Each row of the batch is at its own position: a row that joined late has fewer positions
written than one that started with the batch. The cache keeps

* self-attention keys/values in buffers (N, H, room, Dh), row i's first ``length[i]``
  positions written, zeros after them; a step writes each row's new position at its own
  ``length[i]`` and attends over the first W = max(length) + 1 positions through a key mask
  (True = may attend, the one mask convention) that hides each row's unwritten ones;
* cross-attention keys/values (N, H, S, Dh), one row per decoder row, the source padded to the
  longest of the batch, with their key mask (N, 1, 1, S) (the encoder's padding mask).

It has the interface of the model's :class:`~transduce.model.attention.KVCache` (``layers``,
``length``, each layer's ``append``, ``key_mask``, ``cross_k``/``cross_v``), so the step is
``model.decode``, eager, with the model's own layers: its ``length`` is a (N,) tensor, each
row's first position (:func:`~transduce.model.embeddings` positions per row), which ``decode``
advances in place.

Why padded rows and not paged blocks: a step gathers nothing when no row leaves, joins or
reorders (greedy search and sampling); when some do, :meth:`RowKVCache.regather` makes the new
batch in one ``index_select`` per buffer into fresh memory (the copy beam search's reorder
already makes every step), with the joining rows written after the kept ones. Paged blocks save
that copy but need an attention kernel that reads through a block table; the model's attention
reads contiguous keys. Masked keys cost attention work over the padding only (the widest row's
length), which is small next to the projections and feed-forward of a step.

Legend: N rows, H heads, T positions (room), S source positions, Dh head dim.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

# Positions the self-attention buffers grow by at a time (and keep free after a regather).
ROOM_CHUNK = 16


@dataclass
class RowLayerCache:
    """One decoder layer's keys and values, rows at their own positions; the interface of
    :class:`~transduce.model.attention.LayerCache` for one new position per row and step."""

    self_k: Tensor                    # (N, H, room, Dh), zeros after each row's length
    self_v: Tensor
    cross_k: Tensor                   # (N, H, S, Dh), zeros on padding
    cross_v: Tensor
    at: Tensor | None = None          # (N,) where this step writes (the cache's length)
    width: int = 1                    # W: positions attended this step
    key_mask: Tensor | None = None    # (N, 1, 1, W), set by RowKVCache.ready

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write each row's new key/value (N, H, 1, Dh) at its own position -> the first W
        positions of every row (N, H, W, Dh), hidden beyond each row's own by ``key_mask``."""
        if k.shape[2] != 1:  # (several new positions would need a causal mask among them)
            raise ValueError(f"a row cache takes one new position per step; got {k.shape[2]}")
        rows = torch.arange(k.shape[0], device=k.device)
        self.self_k[rows, :, self.at] = k[:, :, 0]                        # (N, H, Dh) at (row, :, at[row])
        self.self_v[rows, :, self.at] = v[:, :, 0]
        return self.self_k[:, :, :self.width], self.self_v[:, :, :self.width]


@dataclass
class RowKVCache:
    """The continuous batch's cache: :class:`RowLayerCache` per layer, each row's position
    ``length`` (N,) on the device (read by ``model.decode`` as the new tokens' first position and
    advanced by it) and ``lengths`` on the host, the source mask ``cross_mask`` (N, 1, 1, S)."""

    layers: list[RowLayerCache]
    length: Tensor
    cross_mask: Tensor
    lengths: list[int] = field(default_factory=list)
    source_lengths: list[int] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return len(self.lengths)

    @classmethod
    def start(cls, cross: list[tuple[Tensor, Tensor]], mask: Tensor, source_lengths: list[int]) -> "RowKVCache":
        """A cache of fresh rows (nothing written yet): each layer's cross keys/values (N, H, S, Dh)
        and the source mask (N, 1, 1, S)."""
        n, h, _, dh = cross[0][0].shape
        layers = []
        for k, v in cross:
            zeros = k.new_zeros(n, h, ROOM_CHUNK, dh)
            layers.append(RowLayerCache(zeros, zeros.clone(), k, v))
        length = torch.zeros(n, dtype=torch.long, device=mask.device)
        return cls(layers, length, mask, [0] * n, list(source_lengths))

    def ready(self) -> None:
        """Before a step: room for one more position in every row, and each layer told where
        to write and which keys each row may see."""
        width = max(self.lengths) + 1
        for layer in self.layers:
            room = layer.self_k.shape[2]
            if width > room:
                grow = (0, 0, 0, width - room + ROOM_CHUNK)               # pad the positions dim
                layer.self_k, layer.self_v = F.pad(layer.self_k, grow), F.pad(layer.self_v, grow)
        positions = torch.arange(width, device=self.length.device)
        key_mask = (positions[None, :] <= self.length[:, None]).view(self.rows, 1, 1, width)  # (N, 1, 1, W)
        for layer in self.layers:
            layer.at, layer.width, layer.key_mask = self.length, width, key_mask

    def stepped(self) -> None:
        """After a step (``model.decode`` advanced ``length`` on the device): the host's count too."""
        self.lengths = [n + 1 for n in self.lengths]

    def regather(self, keep: list[int], cross_keep: list[int], joining: "RowKVCache | None") -> "RowKVCache":
        """The next step's batch: rows ``keep`` of this one (a row may repeat: beams continuing
        one parent), their cross entries from rows ``cross_keep`` (any row of the same request),
        then the ``joining`` cache's rows. One copy per buffer; the room shrinks to the longest
        kept row plus :data:`ROOM_CHUNK`."""
        lengths = [self.lengths[i] for i in keep]
        sources = [self.source_lengths[i] for i in cross_keep]
        index = torch.tensor(keep, dtype=torch.long, device=self.length.device)
        cross_index = index if cross_keep == keep else torch.tensor(cross_keep, dtype=torch.long,
                                                                   device=self.length.device)
        room = max(lengths, default=0) + ROOM_CHUNK
        s = max(sources + (joining.source_lengths if joining is not None else []), default=1)
        layers = []
        for i, layer in enumerate(self.layers):
            other = joining.layers[i] if joining is not None else None
            room_i = max(room, other.self_k.shape[2] if other is not None else 0)
            self_k = _gathered(layer.self_k, index, room_i, other.self_k if other is not None else None)
            self_v = _gathered(layer.self_v, index, room_i, other.self_v if other is not None else None)
            cross_k = _gathered(layer.cross_k, cross_index, s, other.cross_k if other is not None else None)
            cross_v = _gathered(layer.cross_v, cross_index, s, other.cross_v if other is not None else None)
            layers.append(RowLayerCache(self_k, self_v, cross_k, cross_v))
        mask = _gathered(self.cross_mask[:, 0], cross_index, s,  # (N, 1, S): S along dim 2
                         joining.cross_mask[:, 0] if joining is not None else None).unsqueeze(1)
        length = self.length.index_select(0, index)
        if joining is not None:
            length = torch.cat([length, joining.length])
            lengths, sources = lengths + joining.lengths, sources + joining.source_lengths
        return RowKVCache(layers, length, mask, lengths, sources)


def _gathered(x: Tensor, index: Tensor, width: int, extra: Tensor | None) -> Tensor:
    """Rows ``index`` of ``x`` (N, C, P, ...) cut or zero-padded to ``width`` along dim 2,
    then the rows of ``extra`` (cut or padded alike): one fresh tensor (N' + E, C, width, ...)."""
    n_keep, n_extra = index.shape[0], 0 if extra is None else extra.shape[0]
    out = x.new_zeros(n_keep + n_extra, x.shape[1], width, *x.shape[3:])
    if n_keep:
        part = min(width, x.shape[2])
        out[:n_keep, :, :part] = x[:, :, :part].index_select(0, index)
    if extra is not None:
        part = min(width, extra.shape[2])
        out[n_keep:, :, :part] = extra[:, :, :part]
    return out
