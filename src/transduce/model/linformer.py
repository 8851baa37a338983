"""Linformer attention for long inputs (Wang et al., 2020, https://arxiv.org/abs/2006.04768):
keys and values projected along the sequence to k rows by learned (k x max_len) matrices E and
F (Eq. 7; one E and F per layer, shared by the heads), then Eq. 1 over the k rows.

Legend: B batch, H heads, Tq query length, S key length, Dh head dim, k projected length.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import ConfigError


@dataclass(frozen=True, eq=False)
class LinformerAttention:
    """The kernel of ``model.attention="linformer"``, called by
    :meth:`MultiHeadAttention.attend`. E and F are that module's ``e_proj`` and ``f_proj``
    (their names are part of the checkpoint); this kernel only holds them."""

    e_proj: nn.Linear
    f_proj: nn.Linear

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool, start: int,
                 dropout: float) -> Tensor:
        """Eq. 1 over E K and F V; ``is_causal`` and ``start`` do not apply (the projection mixes
        every position: Linformer has no causal form, and config refuses one)."""
        k, v = self.project(k, v, mask)                                  # (B, H, k, Dh)
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout)

    def with_weights(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool,
                     dropout: float) -> tuple[Tensor, Tensor]:
        raise ConfigError("model.attention: attention maps need full attention; this model has linformer attention")

    def project(self, k: Tensor, v: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
        """E K and F V (Eq. 7) over the first S columns of E and F; padded keys and values are
        zeroed first, so that they add nothing and need no mask after.

        Shape: k, v (B, H, S, Dh), mask (B, 1, 1, S) key mask or None -> two (B, H, k, Dh).
        """
        s, max_len = k.shape[-2], self.e_proj.in_features
        if s > max_len:
            raise ConfigError(f"model.max_positions: linformer attention spans {max_len} positions; got {s}")
        if mask is not None:
            keep = mask.transpose(-2, -1)                                 # (B, 1, S, 1)
            k, v = k.masked_fill(~keep, 0.0), v.masked_fill(~keep, 0.0)
        return self.e_proj.weight[:, :s] @ k, self.f_proj.weight[:, :s] @ v   # (k, S) @ (B, H, S, Dh)
