"""Label-smoothed cross-entropy (Sec. 5.4, "Label Smoothing", eps_ls = 0.1)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class LossOutput:
    """Sums over non-pad target positions; divide by ``n_tokens`` for means."""

    loss: Tensor      # smoothed loss, the training objective (sum)
    nll: Tensor       # plain negative log-likelihood (sum), for perplexity
    n_tokens: int


def label_smoothed_loss(logits: Tensor, target: Tensor, smoothing: float, pad_id: int) -> LossOutput:
    """Cross-entropy against (1 - eps) * one_hot + eps / V, ignoring pad targets.

    This is exactly ``F.cross_entropy(logits, target, label_smoothing=eps, ignore_index=pad,
    reduction="sum")`` (the smoothing mass is spread over all V classes, the true one included),
    computed from one log-softmax so the NLL for perplexity comes for free.

    Shape: logits (B, T, V), target (B, T).
    """
    logp = torch.log_softmax(logits.float(), dim=-1)                   # (B, T, V)
    keep = target != pad_id                                             # (B, T)
    nll = -logp.gather(-1, target.unsqueeze(-1)).squeeze(-1)            # (B, T)
    smooth = -logp.mean(dim=-1)                                         # (B, T)
    loss = (1.0 - smoothing) * nll + smoothing * smooth
    return LossOutput(loss[keep].sum(), nll[keep].sum().detach(), int(keep.sum()))
