"""Guided alignment training: one cross-attention head learns to align (Garg et al., 2019,
"Jointly Learning to Align and Translate with Transformer Models"; Marian's
``--guided-alignment``, OpenNMT-py's ``lambda_align``).

External word alignments (``data.train_alignments``: ``i-j`` links, e.g. from fast_align or
eflomal, one line per training pair; stored with the prepared pairs, :mod:`transduce.data.alignments`)
become, for each target subword, a distribution over source subwords: uniform over the subwords
of the source words its word is linked to; the batches carry it (``Batch.alignment``, built in
collate). The loss is the cross-entropy of one head's attention against it, summed over the
target subwords that have a link (the others, EOS and padding add nothing), and is added
``train.guided_alignment_weight`` times to the label-smoothed loss before the division by the
step's target tokens. The head is the one alignments are read from after training:
``decode.alignment_layer`` (the penultimate decoder layer by default) and ``decode.alignment_head``
(head 0 when unset; the trained run's saved decode settings then name head 0, so ``translate
--output-format jsonl`` reads the guided head without flags).

Legend: B pairs, S source length (EOS counted), T target length (EOS counted).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import torch
from torch import Tensor

from ..config import RunConfig
from ..data.alignments import reference, word_index
from ..data.prepared import PreparedData
from ..errors import ConfigError
from ..inference.search.common import AttentionChoice
from ..inference.text.alignment import alignment_choice


def alignment_targets(links: Sequence[tuple[int, int]], src_pieces: Sequence[str], tgt_pieces: Sequence[str],
                      s: int, t: int) -> Tensor:
    """The (T, S) reference of one pair from its pieces (see :func:`transduce.data.alignments.reference`)."""
    return reference(links, word_index(src_pieces), word_index(tgt_pieces), s, t)


def guided_alignment_loss(attention: Tensor, reference: Tensor, eps: float = 1e-6) -> Tensor:
    """Summed cross-entropy ``-sum_j sum_i ref[j, i] log att[j, i]`` over the rows with a link.

    Shape: attention (B, T, S) one head's cross-attention weights (rows sum to 1), reference
    (B, T, S) from :func:`alignment_targets` (rows sum to 1 or are zero) -> scalar.
    """
    return -(reference * attention.float().clamp(min=eps).log()).sum()


def guided_setup(cfg: RunConfig, data: PreparedData, model_cfg) -> tuple[RunConfig, AttentionChoice | None]:
    """The run's config with ``decode.alignment_head`` set to the guided head (0 when unset), and
    that head; ``(cfg, None)`` when the training data carries no alignments or the weight is 0."""
    if not data.has_alignments("train") or cfg.train.guided_alignment_weight == 0:
        return cfg, None
    if not (cfg.task_spec.translates and model_cfg.family.translates):
        raise ConfigError(f"data.train_alignments: guided alignment trains an encoder-decoder's cross-attention; "
                          f"this run trains {cfg.task} with model.arch={model_cfg.arch}")
    if cfg.train.cuda_graphs:
        raise ConfigError("train.cuda_graphs: not supported with guided alignment training (data.train_alignments)")
    if cfg.decode.alignment_head is None:
        cfg = replace(cfg, decode=replace(cfg.decode, alignment_head=0))
    return cfg, alignment_choice(model_cfg, cfg.decode)


def guided_states(model: torch.nn.Module, src: Tensor, tgt_in: Tensor, reference: Tensor,
                  choice: AttentionChoice) -> tuple[Tensor, Tensor]:
    """The decoder's final states (B, T, D) and the summed guided loss of ``choice``'s head
    against ``reference`` (B, T, S), from one forward pass that keeps that layer's weights."""
    states, weights = model(src, tgt_in, project=False, weights_layer=choice.layer)     # weights (B, H, T, S)
    return states, guided_alignment_loss(weights[:, choice.head], reference)
