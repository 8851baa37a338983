"""Length-sorted token-budget batches: a pure function of lengths."""

from __future__ import annotations

import random

import pytest

from transduce.inference import length_sorted_batches


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("budget", [1, 10, 64, 1000])
def test_every_index_once_and_budget_kept(seed, budget):
    rng = random.Random(seed)
    lengths = [rng.randint(1, 40) for _ in range(rng.randint(0, 60))]
    batches = length_sorted_batches(lengths, budget)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        assert len(b) == 1 or len(b) * max(lengths[i] for i in b) <= budget
    flat = [lengths[i] for b in batches for i in b]
    assert flat == sorted(flat, reverse=True)


def test_max_sentences_and_example():
    assert length_sorted_batches([3, 9, 4, 8], max_tokens=18) == [[1, 3], [2, 0]]
    assert length_sorted_batches([2] * 5, max_tokens=100, max_sentences=2) == [[0, 1], [2, 3], [4]]
    assert length_sorted_batches([], max_tokens=10) == []
    with pytest.raises(ValueError):
        length_sorted_batches([1], max_tokens=0)
