"""Attention masks, all built here, all with one convention.

A mask is a boolean tensor where **True means "may attend"**, broadcastable to
(B, H, Tq, Tk). This is the convention of ``F.scaled_dot_product_attention``; note that
``torch.nn.MultiheadAttention`` uses the opposite one (True = blocked).
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
