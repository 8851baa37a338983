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


def decode_step_by_step(model, src, tgt, chunk: int):
    """Decode ``tgt`` with the KV cache one token at a time, and again as a chunk of ``chunk``
    tokens then the rest at once: (step logits, chunked logits, the step-by-step cache)."""
    enc = model.encode(src)
    cache, steps = model.new_cache(), []
    for t in range(tgt.shape[1]):
        out = model.decode(tgt[:, t:t + 1], enc, cache)
        cache = out.cache
        steps.append(out.logits)
    a = model.decode(tgt[:, :chunk], enc, model.new_cache())
    b = model.decode(tgt[:, chunk:], enc, a.cache)
    return torch.cat(steps, 1), torch.cat([a.logits, b.logits], 1), cache
