"""Attention masks, all built here, all with one convention.

A mask is a boolean tensor where **True means "may attend"**, broadcastable to
(B, H, Tq, Tk). This is the convention of ``F.scaled_dot_product_attention``; note that
``torch.nn.MultiheadAttention`` uses the opposite one (True = blocked).

Where a position bias enters the scores (T5's relative positions) the mask is instead a float
tensor added to them, -inf where a key is hidden (:func:`with_bias`), the other form
``F.scaled_dot_product_attention`` takes; :func:`apply_mask` applies either.
"""

from __future__ import annotations

import torch
from torch import Tensor


def padding_mask(tokens: Tensor, pad_id: int) -> Tensor:
    """Key mask that hides padding. (B, S) ids -> (B, 1, 1, S) bool, True at real tokens."""
    return (tokens != pad_id)[:, None, None, :]


def causal_mask(t_q: int, t_k: int | None = None, device: torch.device | None = None) -> Tensor:
    """Lower-triangular mask so position i sees keys <= i (Sec. 3.2.3, "prevent leftward flow").

    With ``t_k > t_q`` the queries are the *last* ``t_q`` positions of a ``t_k``-long sequence
    (incremental decoding with a cache holding ``t_k - t_q`` earlier positions).

    Shape: (1, 1, Tq, Tk).
    """
    t_k = t_q if t_k is None else t_k
    offset = t_k - t_q
    q = torch.arange(t_q, device=device)[:, None] + offset
    k = torch.arange(t_k, device=device)[None, :]
    return (k <= q)[None, None]


def combine(*masks: Tensor | None) -> Tensor | None:
    """Logical AND of the given masks (None entries are ignored; all None gives None)."""
    out = None
    for m in masks:
        if m is not None:
            out = m if out is None else out & m
    return out


def local_mask(q_pos: Tensor, k_pos: Tensor, window: int, n_global: int = 0, causal: bool = False) -> Tensor:
    """Sliding-window mask with global tokens (Longformer, Beltagy et al., 2020, Sec. 3.1).

    Query position i sees key position j when |i - j| <= ``window`` (causal: 0 <= i - j <=
    ``window``), when j < ``n_global`` (every query sees the global tokens) or when
    i < ``n_global`` (the global tokens see every key); causal attention keeps j <= i throughout.

    Shape: q_pos (..., Tq) and k_pos (..., Tk) positions -> (1, 1, ..., Tq, Tk).
    """
    d = q_pos[..., :, None] - k_pos[..., None, :]                        # (..., Tq, Tk)
    band = d.abs() <= window
    glob = (k_pos[..., None, :] < n_global) | (q_pos[..., :, None] < n_global)
    seen = band | glob
    if causal:
        seen = seen & (d >= 0)
    return seen[None, None]


def with_bias(bias: Tensor, mask: Tensor | None) -> Tensor:
    """An additive mask: ``bias`` where the boolean ``mask`` allows, -inf elsewhere.

    Shape: bias (1, H, Tq, Tk), mask broadcastable to (B, H, Tq, Tk) -> broadcast of both.
    """
    return bias if mask is None else bias.masked_fill(~mask, float("-inf"))


def apply_mask(scores: Tensor, mask: Tensor) -> Tensor:
    """Scores (B, H, Tq, Tk) under a boolean mask (hidden keys -inf) or an additive one (added)."""
    if mask.is_floating_point():
        return scores + mask.to(scores.dtype)
    return scores.masked_fill(~mask, float("-inf"))
