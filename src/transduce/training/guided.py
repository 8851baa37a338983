"""Guided alignment training: one cross-attention head learns to align (Garg et al., 2019,
"Jointly Learning to Align and Translate with Transformer Models"; Marian's
``--guided-alignment``, OpenNMT-py's ``lambda_align``).

External word alignments (``i-j`` links, e.g. from fast_align or eflomal, one line per sentence
pair) become, for each target subword, a distribution over source subwords: uniform over the
subwords of the source words its word is linked to. The loss is the cross-entropy of one head's
attention against it, summed over the target subwords that have a link (the others, EOS and
padding add nothing), and is added ``weight`` times to the label-smoothed loss before the
division by the batch's target tokens. After training, ``decode.alignment_layer`` and
``decode.alignment_head`` name that head, and :mod:`transduce.inference.alignment` reads it.

Legend: B pairs, S source length (EOS counted), T target length (EOS counted).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from ..inference.alignment import word_index


def alignment_targets(links: Sequence[tuple[int, int]], src_pieces: Sequence[str], tgt_pieces: Sequence[str],
                      s: int, t: int) -> Tensor:
    """The (T, S) reference: row j, for target piece j, uniform over the source pieces of the
    words linked to piece j's word (a zero row: no link). Links to words beyond either side's
    pieces (a sentence cut at the length limit) are ignored. ``s`` >= len(src_pieces) and ``t``
    >= len(tgt_pieces) leave room for EOS and padding (zero)."""
    ref = torch.zeros(t, s)
    src_words, tgt_words = word_index(src_pieces), word_index(tgt_pieces)
    src_of: dict[int, list[int]] = {}
    for p, w in enumerate(src_words):
        src_of.setdefault(w, []).append(p)
    linked: dict[int, list[int]] = {}
    for i, j in links:
        linked.setdefault(j, []).extend(src_of.get(i, []))
    for p, w in enumerate(tgt_words):
        if linked.get(w):
            ref[p, linked[w]] = 1.0
    return ref / ref.sum(dim=1, keepdim=True).clamp(min=1.0)


def guided_alignment_loss(attention: Tensor, reference: Tensor, eps: float = 1e-6) -> Tensor:
    """Summed cross-entropy ``-sum_j sum_i ref[j, i] log att[j, i]`` over the rows with a link.

    Shape: attention (B, T, S) one head's cross-attention weights (rows sum to 1), reference
    (B, T, S) from :func:`alignment_targets` (rows sum to 1 or are zero) -> scalar.
    """
    return -(reference * attention.float().clamp(min=eps).log()).sum()
