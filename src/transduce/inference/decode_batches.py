"""Inference batches: sentences sorted by length, packed under a token budget.

Sorting puts sentences of similar length together, so little compute is spent on padding;
callers scatter results back to input order. A pure function of lengths, tested alone.
"""

from __future__ import annotations

from typing import Sequence


def length_sorted_batches(lengths: Sequence[int], max_tokens: int,
                          max_sentences: int | None = None) -> list[list[int]]:
    """Indices of ``lengths`` grouped into batches, longest sentences first.

    Every index appears in exactly one batch. A batch of n sentences whose longest has L
    tokens satisfies n * L <= max_tokens (the padded source size, as fairseq's
    ``--max-tokens``), except that a sentence longer than the budget gets a batch of its own.

    Args:
        lengths: source tokens of each sentence (EOS included).
        max_tokens: token budget of a batch.
        max_sentences: optional cap on sentences per batch.

    Examples:
        >>> length_sorted_batches([3, 9, 4, 8], max_tokens=18)
        [[1, 3], [2, 0]]
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be positive, got {max_tokens}")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    width = 0
    for i in order:
        new_width = max(width, lengths[i], 1)
        full = max_sentences is not None and len(current) >= max_sentences
        if current and ((len(current) + 1) * new_width > max_tokens or full):
            batches.append(current)
            current, new_width = [], max(lengths[i], 1)
        current.append(i)
        width = new_width
    if current:
        batches.append(current)
    return batches


def spread_batches(batches: list[list[int]], lengths: Sequence[int], parts: int) -> list[list[int]]:
    """Split the costliest batches in two until there are at least ``parts`` of them.

    For ``parts`` workers decoding batches at once: a single batch of 64 sentences would keep
    one worker busy and the others idle. Cost is padded size (sentences x longest). Order and
    membership are kept: the result lists every index once, longest batches first.

    Examples:
        >>> spread_batches([[1, 3, 2, 0]], [3, 9, 4, 8], parts=2)
        [[1, 3], [2, 0]]
    """
    batches = [list(b) for b in batches]
    while 0 < len(batches) < parts:  # none: a request of empty or cached sentences only
        costs = [len(b) * max(lengths[i] for i in b) for b in batches]
        big = max(range(len(batches)), key=costs.__getitem__)
        if len(batches[big]) < 2:
            break
        half = (len(batches[big]) + 1) // 2
        batches[big:big + 1] = [batches[big][:half], batches[big][half:]]
    return batches
