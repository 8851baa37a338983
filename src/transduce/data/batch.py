"""Collating raw-id pairs into padded model batches (teacher forcing, paper Section 3.1)::

    pair (raw token ids):  src = [a, b, c]        tgt = [x, y]
    source ids:            [a, b, c, EOS]          encoder input            (B, S)
    target input:          [BOS, x, y]             decoder input            (B, T)
    target labels:         [x, y, EOS]             what the decoder predicts (B, T)

The ids are the model's (:class:`Specials`): transduce's own PAD 0, BOS 1, EOS 2, or an imported
model's (GPT-2's ``<|endoftext|>`` is BOS, EOS and PAD at once, so its padded labels carry
:data:`~transduce.config.model.IGNORE_LABEL` instead, and its EOS label still counts).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Sequence

import numpy as np
import torch

from transduce.config import ModelConfig
from transduce.data.alignments import alignment_targets
from transduce.data.tokenizer import BOS_ID, EOS_ID, PAD_ID


class Specials(NamedTuple):
    """The ids a batch adds: PAD (inputs), BOS, EOS, and the value padded labels carry (the loss
    skips it). The defaults are transduce's fixed ids; :meth:`of` a model's."""

    pad: int = PAD_ID
    bos: int = BOS_ID
    eos: int = EOS_ID
    label_pad: int = PAD_ID

    @classmethod
    def of(cls, cfg: ModelConfig) -> "Specials":
        return cls(cfg.pad_id, cfg.bos_id, cfg.eos_id, cfg.label_pad_id)


DEFAULT_SPECIALS = Specials()


@dataclass
class Batch:
    """Padded model inputs for one batch (see the module docstring for the convention).

    Shape:
        src: (B, S) source ids + EOS, PAD-padded.
        tgt_in: (B, T) BOS + target ids, PAD-padded.
        tgt_out: (B, T) target ids + EOS, PAD-padded; PAD positions are ignored by the loss.
        next_labels: (B,) a masked-LM batch's next-sentence labels (0 IsNext, 1 NotNext, -1
            ignored), or None (see :func:`transduce.data.encoder_inputs.next_sentence_batch`).
        alignment: (B, T, S) guided alignment training's reference (row j: a distribution over
            the source positions target label j's word is linked to, or zeros), or None (see
            :mod:`transduce.data.alignments`).
    """

    src: torch.Tensor
    tgt_in: torch.Tensor
    tgt_out: torch.Tensor
    n_src_tokens: int  # non-pad source positions (EOS included)
    n_tgt_tokens: int  # non-pad labels (EOS included): the loss normaliser
    next_labels: torch.Tensor | None = None
    alignment: torch.Tensor | None = None

    def to(self, device: torch.device | str) -> "Batch":
        """A copy with the tensors on ``device`` (non-blocking where possible)."""
        nsp, ref = (None if x is None else x.to(device, non_blocking=True) for x in (self.next_labels, self.alignment))
        return Batch(self.src.to(device, non_blocking=True),
                     self.tgt_in.to(device, non_blocking=True),
                     self.tgt_out.to(device, non_blocking=True),
                     self.n_src_tokens, self.n_tgt_tokens, nsp, ref)

    def pin_memory(self) -> "Batch":
        """A copy in page-locked host memory, so that ``to(cuda)`` copies asynchronously."""
        nsp, ref = (None if x is None else x.pin_memory() for x in (self.next_labels, self.alignment))
        return Batch(self.src.pin_memory(), self.tgt_in.pin_memory(), self.tgt_out.pin_memory(),
                     self.n_src_tokens, self.n_tgt_tokens, nsp, ref)

    def padded(self, rows: int, src_len: int, tgt_len: int, specials: Specials = DEFAULT_SPECIALS) -> "Batch":
        """This batch grown to ``rows`` rows of (``src_len``, ``tgt_len``) positions.

        New columns are PAD (ignored by attention masks and the loss). New rows are dummies that
        add nothing to the loss or the gradients and keep every activation finite: the source a
        lone EOS (one key to attend to), the target input a lone BOS, the labels all PAD. Used
        to give batches a few fixed shapes (``train.pad_multiple``, ``train.cuda_graphs``).

        Shape: (B, S), (B, T) -> (rows, src_len), (rows, tgt_len); rows >= B, src_len >= S, tgt_len >= T.
        """
        b, s, t = len(self), self.src.size(1), self.tgt_in.size(1)
        if rows < b or src_len < s or tgt_len < t:
            raise ValueError(f"padded: ({rows}, {src_len}, {tgt_len}) is smaller than the batch ({b}, {s}, {t})")
        if (rows, src_len, tgt_len) == (b, s, t):
            return self
        src = self.src.new_full((rows, src_len), specials.pad)
        tgt_in = self.tgt_in.new_full((rows, tgt_len), specials.pad)
        tgt_out = self.tgt_out.new_full((rows, tgt_len), specials.label_pad)
        src[:b, :s], tgt_in[:b, :t], tgt_out[:b, :t] = self.src, self.tgt_in, self.tgt_out
        src[b:, 0], tgt_in[b:, 0] = specials.eos, specials.bos
        nsp = None
        if self.next_labels is not None:  # the dummy rows' next-sentence labels are ignored (-1)
            nsp = self.next_labels.new_full((rows,), -1)
            nsp[:b] = self.next_labels
        ref = None
        if self.alignment is not None:  # new rows and columns: no link
            ref = self.alignment.new_zeros((rows, tgt_len, src_len))
            ref[:b, :t, :s] = self.alignment
        return Batch(src, tgt_in, tgt_out, self.n_src_tokens, self.n_tgt_tokens, nsp, ref)

    def src_types(self) -> torch.Tensor:
        """BERT's segment ids of the source rows (:func:`token_types`). Shape: (B, S)."""
        return token_types(self.src)

    def __len__(self) -> int:
        return self.src.size(0)


def collate(pairs: Sequence[tuple[Sequence[int], Sequence[int]]], specials: Specials = DEFAULT_SPECIALS,
            links: Sequence[np.ndarray] | None = None, word_starts: tuple[np.ndarray, np.ndarray] | None = None
            ) -> Batch:
    """Build a :class:`Batch` from raw-id pairs (lists or arrays), adding EOS to sources and BOS/EOS
    to targets (``specials``: the model's ids). With each pair's word ``links`` and the sides'
    ``word_starts`` (:mod:`transduce.data.alignments`), also the guided alignment reference."""
    if not len(pairs):
        raise ValueError("collate: empty list of pairs")
    src = pad([s for s, _ in pairs], specials.pad, eos=True, specials=specials)                  # (B, S)
    tgt_in = pad([t for _, t in pairs], specials.pad, bos=True, specials=specials)               # (B, T)
    tgt_out = pad([t for _, t in pairs], specials.label_pad, eos=True, specials=specials)        # (B, T)
    n_src = sum(len(s) + 1 for s, _ in pairs)
    n_tgt = sum(len(t) + 1 for _, t in pairs)
    ref = None
    if links is not None and word_starts is not None:
        ref = alignment_targets(links, [s for s, _ in pairs], [t for _, t in pairs], word_starts,
                                src.shape[1], tgt_out.shape[1])                               # (B, T, S)
    return Batch(src, tgt_in, tgt_out, n_src, n_tgt, alignment=ref)


def pad(rows: Sequence[Sequence[int]], pad_id: int = PAD_ID, bos: bool = False, eos: bool = False,
        specials: Specials = DEFAULT_SPECIALS) -> torch.Tensor:
    """Rows (lists or arrays), each with BOS before and/or EOS after (``specials``' ids), right-padded
    with ``pad_id``: a (B, width) long tensor."""
    width = max(len(r) for r in rows) + bos + eos
    out = np.full((len(rows), width), pad_id, dtype=np.int64)
    for i, row in enumerate(rows):
        out[i, bos:bos + len(row)] = row
        if bos:
            out[i, 0] = specials.bos
        if eos:
            out[i, bos + len(row)] = specials.eos
    return torch.from_numpy(out)


def token_types(ids: torch.Tensor, eos_id: int = EOS_ID, pad_id: int = PAD_ID) -> torch.Tensor:
    """BERT's segment ids of BOS-first rows: 0 up to and including the first EOS ([SEP]), 1 after
    it, 0 at PAD. ``BOS a EOS`` is all segment 0; a pair ``BOS a EOS b EOS`` is 0 for ``BOS a EOS``
    and 1 for ``b EOS`` (see :mod:`transduce.data.labelled`). Shape: (B, T) -> (B, T)."""
    eos = (ids == eos_id).long()
    after_sep = (eos.cumsum(1) - eos) > 0                                # an EOS strictly before
    return (after_sep & (ids != pad_id)).long()
