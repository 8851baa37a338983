"""The encoder-only tasks' losses: BERT's masked-LM loss (with next-sentence prediction) and classification.

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


def pretraining_loss(model: EncoderOnly, states: Tensor, labels: Tensor, next_labels: Tensor,
                     smoothing: float = 0.0) -> LossOutput:
    """BERT's pretraining objective (Sec. 3.1, Appendix A.2): the masked-LM loss plus the mean
    next-sentence loss of the pooled first position.

    The step divides the summed loss by the step's selected-token count, so the batch's
    next-sentence sum is weighted by its selected tokens per sentence: it then counts as a mean
    over sentences, as in BERT. ``nll`` stays the masked-LM's (perplexity). Shape: states (B, T, D),
    labels (B, T), next_labels (B,) 0/1 (-1 ignored).
    """
    mlm = masked_lm_loss(model, states, labels, smoothing)
    counted = next_labels >= 0                                           # (B,)
    nsp = label_smoothed_loss(model.next_sentence_logits(states[counted])[:, None],
                              next_labels[counted][:, None], smoothing, pad_id=-1)
    weight = mlm.n_tokens / counted.sum().clamp(min=1)
    return LossOutput(mlm.loss + nsp.loss * weight, mlm.nll, mlm.n_tokens)


def classification_loss(logits: Tensor, labels: Tensor, smoothing: float = 0.0) -> LossOutput:
    """The (label-smoothed) cross-entropy of class ``labels`` (B,) under ``logits`` (B, K);
    ``n_tokens`` counts the sentences."""
    return label_smoothed_loss(logits[:, None], labels[:, None], smoothing, pad_id=-1)  # no label is ignored
