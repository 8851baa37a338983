import itertools
import random

import numpy as np
import pytest

from transduce.data import epoch_batches
from transduce.data.epoch_batches import padded_width, token_budget_batches


def _lengths(rng: random.Random, n: int, hi: int = 80) -> tuple[list[int], list[int]]:
    src = [rng.randint(0, hi) for _ in range(n)]
    tgt = [max(0, s + rng.randint(-10, 10)) for s in src]
    return src, tgt


@pytest.mark.parametrize("trial", range(25))
def test_budget_and_exact_coverage(trial):
    rng = random.Random(trial)
    src, tgt = _lengths(rng, rng.randint(0, 400), hi=rng.choice([5, 40, 120]))
    max_tokens = rng.choice([30, 64, 100, 257, 1000])
    plan = token_budget_batches(src, tgt, max_tokens, seed=trial, epoch=rng.randint(0, 5),
                                shuffle=bool(trial % 2))
    for batch in plan.batches:
        assert batch, "no empty batches"
        assert len(batch) * max(max(src[i] + 1, tgt[i] + 1) for i in batch) <= max_tokens
    seen = sorted(itertools.chain.from_iterable(plan.batches))
    fits = [i for i in range(len(src)) if padded_width(src[i], tgt[i]) <= max_tokens]
    assert seen == fits  # every kept pair exactly once
    assert plan.dropped == len(src) - len(fits)


def test_overlong_pairs_are_dropped_with_a_warning(caplog):
    plan = token_budget_batches([3, 50, 4], [3, 2, 60], max_tokens=20, seed=0, epoch=0)
    assert plan.batches == [[0]] and plan.dropped == 2
    assert "2 pairs are longer than max_tokens=20" in caplog.text


def test_budget_counts_eos_and_bos():
    # width = max(src + 1, tgt + 1) = 5, so 4 pairs fit 20 tokens but not 19
    assert [len(b) for b in token_budget_batches([4] * 4, [3] * 4, 20, 0, 0).batches] == [4]
    assert len(token_budget_batches([4] * 4, [3] * 4, 19, 0, 0).batches) == 2


def test_same_seed_and_epoch_give_the_same_batches():
    src, tgt = _lengths(random.Random(1), 500)
    a = token_budget_batches(src, tgt, 500, seed=7, epoch=3)
    b = token_budget_batches(src, tgt, 500, seed=7, epoch=3)
    assert a.batches == b.batches
    assert token_budget_batches(src, tgt, 500, seed=7, epoch=4).batches != a.batches
    assert token_budget_batches(src, tgt, 500, seed=8, epoch=3).batches != a.batches


def test_unshuffled_batches_are_sorted_by_length():
    src, tgt = _lengths(random.Random(2), 300)
    plan = token_budget_batches(src, tgt, 400, seed=0, epoch=0, shuffle=False)
    flat = list(itertools.chain.from_iterable(plan.batches))
    keys = [(tgt[i], src[i], i) for i in flat]
    assert keys == sorted(keys)
    assert plan.batches == token_budget_batches(src, tgt, 400, seed=9, epoch=9,
                                                shuffle=False).batches


def _pad_ratios(batches, src, tgt) -> tuple[float, float]:
    real_src = sum(src[i] + 1 for b in batches for i in b)
    real_tgt = sum(tgt[i] + 1 for b in batches for i in b)
    padded_src = sum(len(b) * max(src[i] + 1 for i in b) for b in batches)
    padded_tgt = sum(len(b) * max(tgt[i] + 1 for i in b) for b in batches)
    return 1 - real_src / padded_src, 1 - real_tgt / padded_tgt


def test_bucketing_keeps_padding_low():
    src, tgt = _lengths(random.Random(3), 3000)
    plan = token_budget_batches(src, tgt, 2000, 0, 0)
    assert sum(len(b) for b in plan.batches) == 3000
    src_pad, tgt_pad = _pad_ratios(plan.batches, src, tgt)
    assert tgt_pad < 0.05
    assert src_pad < 0.2  # source lengths vary within one target length


def _greedy(order, widths, max_tokens):
    """The packing rule written as the obvious loop: the reference for the vectorised one."""
    batches, current, width = [], [], 0
    for i in order:
        new_width = max(width, widths[i])
        if current and (len(current) + 1) * new_width > max_tokens:
            batches.append(current)
            current, new_width = [], widths[i]
        current.append(i)
        width = new_width
    return batches + ([current] if current else [])


@pytest.mark.parametrize("trial", range(30))
def test_packing_equals_the_greedy_loop(trial):
    rng = random.Random(100 + trial)
    src, tgt = _lengths(rng, rng.randint(1, 300), hi=rng.choice([3, 40]))
    max_tokens = rng.randint(2, 300)
    plan = token_budget_batches(src, tgt, max_tokens, seed=0, epoch=0, shuffle=False)
    widths = [max(s, t) + 1 for s, t in zip(src, tgt)]
    order = sorted((i for i in range(len(src)) if widths[i] <= max_tokens), key=lambda i: (tgt[i], src[i], i))
    assert plan.batches == _greedy(order, widths, max_tokens)


def test_large_corpora_are_sorted_within_shuffled_pools(monkeypatch):
    monkeypatch.setattr(epoch_batches, "POOL", 100)
    src, tgt = _lengths(random.Random(5), 1000)
    plan = token_budget_batches(np.array(src, np.uint16), np.array(tgt, np.uint16), 300, seed=1, epoch=0)
    assert sorted(plan.order.tolist()) == list(range(1000))
    for lo in range(0, 1000, 100):  # each pool of the shuffled order is sorted by length
        pool = plan.order[lo:lo + 100]
        keys = [(tgt[i], src[i]) for i in pool]
        assert keys == sorted(keys)
    assert not any(s < lo < e for s, e in zip(plan.starts, plan.ends) for lo in range(0, 1000, 100))
    assert plan.batches == token_budget_batches(src, tgt, 300, seed=1, epoch=0).batches  # lists or arrays


def test_mismatched_lengths_are_rejected():
    with pytest.raises(ValueError):
        token_budget_batches([1, 2], [1], 10, 0, 0)
