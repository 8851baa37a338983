"""Token-budget batching: a pure function of sentence lengths (paper, Section 5.1).

"Sentence pairs were batched together by approximate sequence length. Each training batch
contained a set of sentence pairs containing approximately 25000 source tokens and 25000
target tokens." We bound the *padded* size instead, which is what memory depends on:

    budget rule:  n_sentences * max(max_src_len + 1, max_tgt_len + 1) <= max_tokens

where lengths are raw token counts and the ``+ 1`` is the EOS on the source and the BOS/EOS on
the target (see ``corpus.collate``). The pairs are shuffled from ``(seed, epoch)`` and cut into
pools of ``POOL`` pairs; each pool is sorted by (target length, source length), ties keeping
the shuffled order, and packed greedily; then the order of all batches is shuffled. A corpus
smaller than a pool is sorted as a whole. Same lengths, seed and epoch: same batches, on every
machine. Everything is numpy over the length arrays, so a plan for millions of pairs takes a
second and a few bytes per pair.

Distributed training: every rank builds the same plan and consumes it in groups of
``grad_accum * world_size`` consecutive batches, rank ``r`` taking ``group[r::world_size]``
(``training.feed.StepFeed.step_data``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

logger = logging.getLogger(__name__)

POOL = 1 << 18  # pairs sorted together: enough for tight batches, small enough to sort in cache


@dataclass
class BatchPlan:
    """The batches of one epoch: batch ``i`` is ``order[starts[i]:ends[i]]`` (pair indices).

    ``dropped`` counts the pairs that fit no batch on their own (wider than the budget).
    """

    order: np.ndarray   # (n_pairs_kept,) pair indices (int32 below 2**31 pairs), batch after batch
    starts: np.ndarray  # (n_batches,) int64, in batch order
    ends: np.ndarray    # (n_batches,) int64
    dropped: int = 0

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.order[self.starts[i]:self.ends[i]]

    @property
    def batches(self) -> list[list[int]]:
        """Every batch as a list of pair indices (for small plans: tests, inspection)."""
        return [self[i].tolist() for i in range(len(self))]


def padded_width(src_len, tgt_len):
    """Padded positions one pair needs: its longer side plus EOS/BOS (ints or arrays)."""
    return np.maximum(src_len, tgt_len) + 1


def round_up(n, multiple: int):
    """The least multiple of ``multiple`` that is >= ``n`` (ints or integer arrays)."""
    return (n + multiple - 1) // multiple * multiple


def token_budget_batches(src_lens, tgt_lens, max_tokens: int, seed: int, epoch: int,
                         shuffle: bool = True, multiple: int = 1) -> BatchPlan:
    """Group pair indices into length-sorted batches under a padded token budget.

    Args:
        src_lens: raw source token counts of each pair (no EOS/BOS); a sequence or 1-D array.
        tgt_lens: raw target token counts of each pair, likewise.
        max_tokens: budget; every batch satisfies the rule in the module docstring.
        seed: with ``epoch``, determines the shuffle (pools and tie-breaks) and the batch order.
        epoch: see ``seed``.
        shuffle: if False, one pool sorted with ties in index order, batches in length order.
        multiple: widths are counted rounded up to a multiple of this, so that a batch padded to
            its bucket ``L = round_up(width, multiple)`` on both sides and to ``max_tokens // L``
            rows still fits the budget (the few fixed shapes of ``train.cuda_graphs``).

    Returns:
        A :class:`BatchPlan`; every pair that fits the budget appears in exactly one batch.
    """
    src, tgt = _lengths(src_lens), _lengths(tgt_lens)
    if src.shape != tgt.shape or src.ndim != 1:
        raise ValueError(f"{src.size} source lengths but {tgt.size} target lengths")
    if max_tokens < 2:
        raise ValueError(f"max_tokens must be at least 2, got {max_tokens}")
    if multiple < 1:
        raise ValueError(f"multiple must be positive, got {multiple}")
    fits = round_up(padded_width(src, tgt), multiple) <= max_tokens  # padded width within budget
    index = np.int32 if src.size < 2**31 else np.int64  # 4 bytes a pair: plans of millions stay small
    order = np.arange(src.size, dtype=index) if fits.all() else np.flatnonzero(fits).astype(index)
    del fits
    dropped = int(src.size - order.size)
    if dropped:
        logger.warning("%d pairs are longer than max_tokens=%d on their own; dropped", dropped, max_tokens)
    rng = np.random.default_rng([seed, epoch, 0x7472616E]) if shuffle else None  # "tran": a stream of its own
    if rng is not None:
        rng.shuffle(order)
    starts, ends = [], []
    for lo in range(0, order.size, POOL if shuffle else max(order.size, 1)):
        pool = order[lo:lo + (POOL if shuffle else order.size)]
        pool[:] = pool[np.lexsort((src[pool], tgt[pool]))]  # stable: ties keep the pool's order
        cuts = _pack(round_up(padded_width(src[pool], tgt[pool]), multiple), max_tokens) + lo  # offsets into ``order``
        starts.append(cuts[:-1])
        ends.append(cuts[1:])
    start = np.concatenate(starts) if starts else np.zeros(0, np.int64)
    end = np.concatenate(ends) if ends else np.zeros(0, np.int64)
    if rng is not None:
        perm = rng.permutation(start.size)
        start, end = start[perm], end[perm]
    return BatchPlan(order, start, end, dropped)


def _lengths(values) -> np.ndarray:
    """Lengths as an integer array, kept in their own (small) dtype when they are one already."""
    array = np.asarray(values)
    return array if array.dtype.kind in "iu" else array.astype(np.int64)


def _pack(widths: np.ndarray, max_tokens: int) -> np.ndarray:
    """Greedy cut points of ``widths`` (in order): a batch grows while ``n * max(width) <= max_tokens``.

    A batch starting at ``p`` holds at most ``max_tokens // widths[p]`` pairs, so only that
    window is scanned (a running maximum times the running count).
    """
    cuts = [0]
    p, n = 0, widths.size
    while p < n:
        window = widths[p:p + max_tokens // int(widths[p]) + 1]
        over = np.maximum.accumulate(window) * np.arange(1, window.size + 1) > max_tokens
        p += int(np.argmax(over)) if over.any() else window.size
        cuts.append(p)
    return np.asarray(cuts, dtype=np.int64)
