import itertools
import random

import pytest

from transduce.data.batching import (BatchIterator, batch_stats, padded_width, shard_batches,
                                     token_budget_batches)
from transduce.errors import DataError


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


def test_bucketing_keeps_padding_low():
    src, tgt = _lengths(random.Random(3), 3000)
    stats = batch_stats(token_budget_batches(src, tgt, 2000, 0, 0).batches, src, tgt)
    assert stats["n_sentences"] == 3000
    assert stats["tgt_pad_ratio"] < 0.05
    assert stats["src_pad_ratio"] < 0.2  # source lengths vary within one target length
    assert stats["max_padded_tokens"] <= 2000


def test_batch_stats_by_hand():
    src, tgt = [1, 3, 2], [2, 2, 5]
    stats = batch_stats([[0, 1], [2]], src, tgt)
    # batch 0: src+1 = [2, 4] (padded 8), tgt+1 = [3, 3] (padded 6), budget 2 * 4 = 8
    # batch 1: src+1 = [3] (padded 3), tgt+1 = [6] (padded 6), budget 6
    assert stats["n_batches"] == 2 and stats["n_sentences"] == 3
    assert stats["mean_sentences"] == 1.5
    assert stats["mean_src_tokens"] == (6 + 3) / 2
    assert stats["mean_tgt_tokens"] == (6 + 6) / 2
    assert stats["src_pad_ratio"] == pytest.approx(1 - 9 / 11)
    assert stats["tgt_pad_ratio"] == pytest.approx(0.0)
    assert stats["mean_padded_tokens"] == 7.0 and stats["max_padded_tokens"] == 8
    assert batch_stats([], src, tgt)["n_batches"] == 0


def test_mismatched_lengths_are_rejected():
    with pytest.raises(ValueError):
        token_budget_batches([1, 2], [1], 10, 0, 0)


# ---- BatchIterator ------------------------------------------------------------------------------

def _iterator(**kwargs) -> BatchIterator:
    src, tgt = _lengths(random.Random(4), 400)
    return BatchIterator(src, tgt, max_tokens=300, seed=5, **kwargs)


def test_iterator_walks_epochs_with_fresh_shuffles():
    it = _iterator()
    first, second = list(it), list(it)
    assert it.state_dict() == {"epoch": 2, "offset": 0}
    assert first == it.plan(0).batches and second == it.plan(1).batches
    assert first != second
    assert sorted(itertools.chain(*first)) == sorted(itertools.chain(*second)) == list(range(400))


@pytest.mark.parametrize("stop_after", [0, 1, 17, "end_of_epoch", "epoch_and_one"])
def test_resume_gives_the_same_remaining_batches(stop_after):
    reference = _iterator()
    expected = list(reference) + list(reference) + list(reference)
    n0 = len(reference.plan(0).batches)
    stop_after = {"end_of_epoch": n0, "epoch_and_one": n0 + 1}.get(stop_after, stop_after)

    it = _iterator()
    taken = []
    while len(taken) < stop_after:
        for batch in it:
            taken.append(batch)
            if len(taken) == stop_after:
                break  # like a crash right after a checkpoint
    state = it.state_dict()

    resumed = _iterator()
    resumed.load_state_dict(state)
    while len(taken) < len(expected):
        taken.extend(resumed)
    assert taken == expected


def test_state_is_the_next_batch_while_one_is_in_use():
    it = _iterator()
    batches = iter(it)
    next(batches)
    assert it.state_dict() == {"epoch": 0, "offset": 1}


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_shards_are_disjoint_equal_and_cover_all_but_the_tail(world_size):
    base = _iterator()
    full = base.plan(0).batches
    shards = [list(base.shard(rank, world_size)) for rank in range(world_size)]
    assert len({len(s) for s in shards}) == 1
    usable = len(full) - len(full) % world_size
    assert sorted(map(tuple, itertools.chain(*shards))) == sorted(map(tuple, full[:usable]))
    assert shards[0] == full[0:usable:world_size]
    for rank in range(world_size):
        assert shard_batches(full, rank, world_size) == shards[rank]


def test_shard_arguments_are_checked():
    with pytest.raises(ValueError):
        shard_batches([[0]], rank=2, world_size=2)
    with pytest.raises(ValueError):
        _iterator(rank=0, world_size=0)


def test_bad_state_is_a_data_error():
    it = _iterator()
    with pytest.raises(DataError, match="offset 10000 is past"):
        it.load_state_dict({"epoch": 0, "offset": 10_000})
    with pytest.raises(DataError, match="non-negative"):
        it.load_state_dict({"epoch": -1, "offset": 0})
    with pytest.raises(DataError):
        it.load_state_dict({})
