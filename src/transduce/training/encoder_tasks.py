"""The encoder-only tasks' losses: BERT's masked-LM loss and classification.

The inputs (BERT's masking, classification batches) are :mod:`transduce.data.encoder_inputs`.
Masked language modelling (Devlin et al., 2019, Sec. 3.1, "Task #1: Masked LM"): the loss is the
cross-entropy of the original tokens at the selected positions only.

Legend: B batch, T length, D d_model, V vocabulary, K classes, N selected positions.
"""

from __future__ import annotations

from torch import Tensor

from ..data.tokenizer import PAD_ID
from ..model.encoder_only import EncoderOnly
from .loss import LossOutput, label_smoothed_loss


def masked_lm_loss(model: EncoderOnly, states: Tensor, labels: Tensor, smoothing: float = 0.0) -> LossOutput:
    """The (label-smoothed) cross-entropy of the original tokens at the selected positions.

    Only the N selected positions go through the masked-LM head, so the (B, T, V) logits are
    never made. Shape: states (B, T, D) from ``model(inputs)``, labels (B, T) from
    :func:`~transduce.data.encoder_inputs.mask_tokens` (PAD where not selected).
    """
    keep = labels != PAD_ID                                              # (B, T)
    logits = model.mlm_logits(states[keep])                              # (N, V)
    return label_smoothed_loss(logits[None], labels[keep][None], smoothing, PAD_ID)


def classification_loss(logits: Tensor, labels: Tensor, smoothing: float = 0.0) -> LossOutput:
    """The (label-smoothed) cross-entropy of class ``labels`` (B,) under ``logits`` (B, K);
    ``n_tokens`` counts the sentences."""
    return label_smoothed_loss(logits[:, None], labels[:, None], smoothing, pad_id=-1)  # no label is ignored
