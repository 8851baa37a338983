"""BigBird block-sparse attention for long inputs (Zaheer et al., 2020,
https://arxiv.org/abs/2007.14062, Sec. 2 and Fig. 1; the "ITC" pattern): queries and keys go in
blocks of ``block`` tokens, and query block i sees

* its window: key blocks i-1, i, i+1 (Fig. 1b),
* the global blocks: the first and the last, which also see every key (Fig. 1c),
* ``n_random`` random key blocks, none of the above, drawn per head (Fig. 1a),

so each query sees (5 + r) blocks whatever the length: O(T) time and memory. The random blocks
are a fixed function of (seed, number of blocks): the layer's seed is saved with the model, so
training, evaluation and a reloaded model run the same pattern. A sequence that does not
divide into blocks is padded (the padding is masked as keys; the last, partial block is the
last global block). Encoder self-attention only: the pattern is not causal.

Two implementations of the same function, proven equal in tests/model/test_sparse_attention.py:

* :func:`bigbird_reference`: full attention under the explicit (T x T) mask the block pattern
  draws; O(T^2), readable, what the blocked version is checked against.
* :func:`bigbird_attention`: the blocked kernel: every middle query block over its (5 + r) key
  blocks gathered beside it, the two global query blocks over all keys, a few blocks at a time,
  in :mod:`~transduce.model.gathered_attention` (flash-style: nothing gathered is kept for the
  backward pass, which gathers again). No (T x T) tensor is made.

Legend: B batch, H heads, T length, Dh head dim, nb blocks, bs block size, r random blocks,
K = 5 + r key blocks per middle query block.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import ConfigError
from .gathered_attention import Step, gathered_attention, step_size
from .masks import combine


@dataclass(frozen=True)
class BigBirdAttention:
    """The kernel of ``model.attention="bigbird"``, called by :meth:`MultiHeadAttention.attend`:
    blocks of ``block`` tokens, ``n_random`` random blocks per query block drawn from ``seed``."""

    block: int
    n_random: int
    seed: int

    def __post_init__(self) -> None:  # (config checks the same; this guards direct use)
        if self.block < 1 or self.n_random < 0:
            raise ConfigError(f"model.attention: bigbird needs block >= 1 and n_random >= 0; "
                              f"got {self.block}, {self.n_random}")

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool, start: int,
                 dropout: float) -> Tensor:
        if is_causal or start or q.shape[-2] != k.shape[-2]:
            raise ConfigError("model.attention: bigbird is encoder self-attention only (not causal, no cache)")
        if mask is not None and mask.shape[-2] != 1:
            raise ConfigError("model.attention: bigbird takes a key (padding) mask, not a per-query mask")
        return bigbird_attention(q, k, v, mask, self.block, self.n_random, self.seed, dropout)

    def with_weights(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool,
                     dropout: float) -> tuple[Tensor, Tensor]:
        raise ConfigError("model.attention: attention maps need full attention; this model has bigbird attention")


def random_blocks(n_blocks: int, n_heads: int, n_random: int, seed: int) -> tuple[Tensor, Tensor]:
    """The random key blocks of every query block, per head: ``n_random`` distinct blocks drawn
    from those outside the window and the global blocks (fewer exist in a short sequence: the
    rest of the slots are unused). The global query blocks (first, last) need none.

    Returns: block indices (H, nb, r) and whether each slot is used (H, nb, r), on the CPU.
    """
    g = torch.Generator().manual_seed(seed)
    i = torch.arange(n_blocks)[:, None]
    j = torch.arange(n_blocks)[None, :]
    allowed = (j > 0) & (j < n_blocks - 1) & ((i - j).abs() > 1) & (i > 0) & (i < n_blocks - 1)  # (nb, nb)
    score = torch.rand(n_heads, n_blocks, n_blocks, generator=g).masked_fill(~allowed, -1.0)
    top, idx = score.topk(min(n_random, n_blocks), dim=-1)                 # (H, nb, r)
    return idx, top >= 0


def block_pattern(n_blocks: int, n_heads: int, n_random: int, seed: int) -> Tensor:
    """Which key blocks each query block sees, per head -> (H, nb, nb) bool (Fig. 1d)."""
    i = torch.arange(n_blocks)[:, None]
    j = torch.arange(n_blocks)[None, :]
    fixed = ((i - j).abs() <= 1) | (i == 0) | (i == n_blocks - 1) | (j == 0) | (j == n_blocks - 1)
    idx, used = random_blocks(n_blocks, n_heads, n_random, seed)
    rand = torch.zeros(n_heads, n_blocks, n_blocks).scatter_add_(-1, idx, used.float()) > 0
    return fixed | rand


def bigbird_reference(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, block: int, n_random: int,
                      seed: int, dropout: float = 0.0) -> Tensor:
    """BigBird as full attention (Eq. 1) under the mask its block pattern draws, cut to T.

    Shape: q, k, v (B, H, T, Dh), mask (B, 1, 1, T) key mask or None -> (B, H, T, Dh).
    """
    t, h = q.shape[-2], q.shape[1]
    n_blocks = -(-t // block)
    pattern = block_pattern(n_blocks, h, n_random, seed).to(q.device)     # (H, nb, nb)
    tokens = pattern.repeat_interleave(block, 1).repeat_interleave(block, 2)[:, :t, :t]  # (H, T, T)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=combine(mask, tokens[None]), dropout_p=dropout)


def key_blocks(n_blocks: int, n_heads: int, n_random: int, seed: int) -> tuple[Tensor, Tensor]:
    """The K = 5 + r key blocks of each middle query block (1 .. nb-2): the two global blocks,
    the window, the random blocks; a window block that is also global is marked unused (it is
    already there), as are random slots a short sequence cannot fill.

    Returns: block indices (H, nb - 2, K) and whether each is used (H, nb - 2, K).
    """
    i = torch.arange(1, n_blocks - 1)[:, None]                              # (nb-2, 1)
    glob = torch.tensor([0, n_blocks - 1]).expand(n_blocks - 2, 2)
    window = i + torch.tensor([-1, 0, 1])                                   # (nb-2, 3)
    fixed = torch.cat([glob, window], dim=1).expand(n_heads, -1, -1)       # (H, nb-2, 5)
    fixed_used = torch.cat([torch.ones(n_blocks - 2, 2, dtype=torch.bool),
                            (window > 0) & (window < n_blocks - 1)], dim=1).expand(n_heads, -1, -1)
    idx, used = random_blocks(n_blocks, n_heads, n_random, seed)
    return torch.cat([fixed, idx[:, 1:-1]], dim=2), torch.cat([fixed_used, used[:, 1:-1]], dim=2)


def bigbird_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, block: int, n_random: int,
                      seed: int, dropout: float = 0.0, step_scores: int | None = None) -> Tensor:
    """:func:`bigbird_reference` in blocks, without a (T x T) tensor, through
    :func:`~transduce.model.gathered_attention.gathered_attention`: the two global query blocks
    over every key, then each middle query block over its K key blocks. A sequence of one or two
    blocks is all global: full attention.

    Neither the gathered key blocks nor the scores are kept for the backward pass (it gathers
    and recomputes them a step at a time): what is kept is q, k, v, the output and a log-sum-exp
    per row, as SDPA's flash kernel keeps. ``step_scores`` bounds the scores of one step
    (default: :func:`~transduce.model.gathered_attention.step_size` of T).

    Shape: q, k, v (B, H, T, Dh), mask (B, 1, 1, T) key mask or None -> (B, H, T, Dh).
    """
    b, h, t, _ = q.shape
    n_blocks = -(-t // block)
    if n_blocks <= 2:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)
    keep = torch.ones(b, t, dtype=torch.bool, device=q.device) if mask is None else mask.reshape(b, t)
    idx, used = (x.to(q.device) for x in key_blocks(n_blocks, h, n_random, seed))  # (H, nb-2, K)
    step_scores = step_size(t) if step_scores is None else step_scores
    return gathered_attention(q, k, v, partial(_steps, keep, idx, used, block, step_scores), dropout)


def _steps(keep: Tensor, idx: Tensor, used: Tensor, block: int, step_scores: int) -> Iterator[Step]:
    """The plan: the global query blocks (first, last) over the keys a range at a time, then the
    middle query blocks a few at a time, each over its key blocks ``idx`` (H, nb - 2, K) where
    ``used``; ``keep`` (B, T) the key mask. Padding positions (T .. nb * bs - 1) are T: none."""
    (b, t), (h, n_middle, n_keys) = keep.shape, idx.shape
    inf = float("-inf")
    pos = torch.arange((n_middle + 2) * block, device=keep.device).clamp(max=t).view(-1, block)  # (nb, bs)
    keep = F.pad(keep, (0, 1), value=False)                                 # (B, T + 1): none is not kept
    ends = torch.cat([pos[0], pos[-1]]).expand(b, h, 1, 2 * block)          # (B, H, 1, 2bs)
    span = max(block, step_scores // (2 * block))
    for first in range(0, t, span):
        cols = torch.arange(first, min(first + span, t), device=keep.device)  # (L,)
        bias = torch.zeros(b, 1, 1, 1, len(cols), device=keep.device).masked_fill(~keep[:, None, None, None, cols], inf)
        yield Step(ends, cols.expand(b, h, 1, -1), bias)                    # bias (B, 1, 1, 1, L)
    per_step = max(1, step_scores // (block * n_keys * block))
    for first in range(0, n_middle, per_step):
        blocks = idx[:, first:first + per_step]                             # (H, n, K)
        rows = pos[1 + first:1 + first + blocks.shape[1]].expand(b, h, -1, -1)  # (B, H, n, bs)
        cols = pos[blocks].flatten(-2)                                      # (H, n, K*bs)
        ok = keep[:, cols] & used[:, first:first + per_step].repeat_interleave(block, -1)  # (B, H, n, K*bs)
        bias = torch.zeros(ok.shape, device=keep.device).masked_fill(~ok, inf)[..., None, :]
        yield Step(rows, cols.expand(b, -1, -1, -1), bias)                  # bias (B, H, n, 1, K*bs)
