"""Shared inputs of the attention tests (tests/model and tests/inference): random q, k, v and a key mask."""

import torch

B, H, T, S, DH = 2, 4, 5, 7, 8
D = H * DH


def _qkv(t_q=T, t_k=S):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(B, H, t_q, DH, generator=g), torch.randn(B, H, t_k, DH, generator=g),
            torch.randn(B, H, t_k, DH, generator=g))


def _key_mask(t_k=S):
    lengths = torch.tensor([t_k, t_k - 3])
    return (torch.arange(t_k)[None, :] < lengths[:, None])[:, None, None, :]   # (B, 1, 1, S)
