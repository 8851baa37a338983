"""Greedy search, beam search and sampling on id tensors: equivalences and designed cases."""

from __future__ import annotations

import math

import pytest
import torch

from inference_helpers import BOS, EOS, PAD, MarkovModel, random_sources, tiny_transformer
from transduce.config import DecodeConfig
from transduce.inference import AttentionChoice, beam_search, greedy_search, length_penalty, max_lengths, sample
from transduce.inference.sampling import filter_logits

A, B, C = 4, 5, 6


def _single_rows(src: torch.Tensor):
    """Each row of a padded batch alone, without its padding."""
    for i in range(src.shape[0]):
        n = int((src[i] != PAD).sum())
        yield i, src[i:i + 1, :n]


@torch.inference_mode()
@pytest.mark.parametrize("seed,min_len", [(0, 0), (1, 0), (2, 3)])
def test_beam_of_one_equals_greedy(seed, min_len):
    model = tiny_transformer(seed=seed)
    src = random_sources([5, 3, 7, 1], seed=seed)
    greedy = greedy_search(model, src, DecodeConfig(max_len_a=1.0, max_len_b=6, min_len=min_len))
    beam = beam_search(model, src, DecodeConfig(beam=1, lenpen=0.6, max_len_a=1.0, max_len_b=6,
                                                  min_len=min_len, nbest=1))
    assert torch.equal(greedy.tokens, beam.tokens)
    assert torch.equal(greedy.lengths, beam.lengths)
    torch.testing.assert_close(greedy.log_probs, beam.log_probs, rtol=0, atol=1e-5)


@torch.inference_mode()
@pytest.mark.parametrize("beam", [2, 4])
def test_batched_beam_search_equals_each_sentence_alone(beam):
    model = tiny_transformer(seed=3)
    src = random_sources([6, 2, 9, 4, 1], seed=3)
    batched = beam_search(model, src, DecodeConfig(beam=beam, lenpen=0.6, max_len_a=1.0, max_len_b=5, nbest=beam))
    for i, one in _single_rows(src):
        alone = beam_search(model, one, DecodeConfig(beam=beam, lenpen=0.6, max_len_a=1.0, max_len_b=5, nbest=beam))
        t = alone.tokens.shape[2]
        assert torch.equal(alone.tokens[0], batched.tokens[i, :, :t])
        assert torch.equal(alone.lengths[0], batched.lengths[i])
        torch.testing.assert_close(alone.scores[0], batched.scores[i], rtol=0, atol=1e-5)


@torch.inference_mode()
def test_cached_greedy_equals_rerunning_the_prefix():
    model = tiny_transformer(seed=4)
    src = random_sources([4, 8, 2], seed=4)
    cached = greedy_search(model, src, DecodeConfig(max_len_a=0.0, max_len_b=12, min_len=12))
    uncached = greedy_search(model, src, DecodeConfig(max_len_a=0.0, max_len_b=12, min_len=12), use_cache=False)
    assert torch.equal(cached.tokens, uncached.tokens)
    torch.testing.assert_close(cached.log_probs, uncached.log_probs, rtol=0, atol=1e-4)


# Greedy takes A (0.6) but every continuation of A is poor; B (0.4) ends with probability 0.9.
TRAP = {BOS: {A: 0.6, B: 0.4}, A: {EOS: 0.4, A: 0.3, B: 0.3}, B: {EOS: 0.9, A: 0.05, B: 0.05}}


def test_beam_finds_the_better_sequence_that_greedy_misses():
    model = MarkovModel(TRAP)
    src = torch.tensor([[A, EOS]])
    greedy = greedy_search(model, src, DecodeConfig(max_len_b=5))
    beam = beam_search(model, src, DecodeConfig(beam=2, lenpen=0.0, max_len_b=5, nbest=2))
    assert greedy.hypothesis(0) == [A, EOS]
    assert math.isclose(float(greedy.log_probs[0, 0]), math.log(0.6 * 0.4), abs_tol=1e-4)
    assert beam.hypothesis(0) == [B, EOS]
    assert math.isclose(float(beam.scores[0, 0]), math.log(0.4 * 0.9), abs_tol=1e-4)
    assert beam.hypothesis(0, 1) == [A, EOS]


# Beam 2. Step 1: A 0.5 (alive), [EOS] 0.3 (finished), C 0.2 (alive). Step 2: [A, B] 0.45
# (alive), [C, EOS] 0.18 (finished): two finished, so "k_finished" stops with [EOS] (0.3) while
# the alive [A, B] goes on to [A, B, EOS] at 0.45.
CUT_OFF = {BOS: {A: 0.5, EOS: 0.3, C: 0.2}, A: {B: 0.9, EOS: 0.1}, B: {EOS: 1.0}, C: {EOS: 0.9, A: 0.1}}


def test_best_finished_stop_rule_searches_on_until_the_best_extension_ends():
    model = MarkovModel(CUT_OFF)
    src = torch.tensor([[A, EOS]])
    k_fin = beam_search(model, src, DecodeConfig(beam=2, lenpen=0.0, max_len_b=6, stop="k_finished", nbest=2))
    best = beam_search(model, src, DecodeConfig(beam=2, lenpen=0.0, max_len_b=6, stop="best_finished", nbest=2))
    assert k_fin.hypothesis(0) == [EOS]
    assert math.isclose(float(k_fin.scores[0, 0]), math.log(0.3), abs_tol=1e-4)
    assert best.hypothesis(0) == [A, B, EOS]
    assert math.isclose(float(best.scores[0, 0]), math.log(0.45), abs_tol=1e-4)
    with pytest.raises(ValueError, match="stop"):
        beam_search(model, src, DecodeConfig(beam=2, stop="never", nbest=2))


@torch.inference_mode()
def test_best_finished_is_never_worse_at_lenpen_zero_and_batches_like_one_sentence():
    model = tiny_transformer(seed=5)
    src = random_sources([6, 2, 9, 4, 1, 7, 3], seed=5)
    k_fin = beam_search(model, src, DecodeConfig(beam=3, lenpen=0.0, max_len_b=8, nbest=3))
    best = beam_search(model, src, DecodeConfig(beam=3, lenpen=0.0, max_len_b=8, stop="best_finished", nbest=3))
    assert bool((best.scores[:, 0] >= k_fin.scores[:, 0] - 1e-5).all())
    for i, one in _single_rows(src):
        alone = beam_search(model, one, DecodeConfig(beam=3, lenpen=0.0, max_len_b=8, stop="best_finished", nbest=1))
        assert alone.hypothesis(0) == best.hypothesis(i)


# [EOS] has probability 0.5 (length 1); [A, EOS] 0.45 * 0.8 = 0.36 (length 2).
SHORT_OR_LONG = {BOS: {EOS: 0.5, A: 0.45, B: 0.05}, A: {EOS: 0.8, A: 0.12, B: 0.08},
                 B: {EOS: 0.9, A: 0.05, B: 0.05}}


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0, 2.0, 3.0, 5.0])
def test_length_penalty_ranks_by_the_gnmt_formula(alpha):
    model = MarkovModel(SHORT_OR_LONG)
    out = beam_search(model, torch.tensor([[A, EOS]]), DecodeConfig(beam=2, lenpen=alpha, max_len_b=5, nbest=2))
    short = math.log(0.5) / ((5 + 1) / 6) ** alpha
    long = math.log(0.45 * 0.8) / ((5 + 2) / 6) ** alpha
    expected = [[EOS], [A, EOS]] if short > long else [[A, EOS], [EOS]]
    assert [out.hypothesis(0, 0), out.hypothesis(0, 1)] == expected
    torch.testing.assert_close(out.scores[0], torch.tensor(sorted([short, long], reverse=True)), rtol=0, atol=1e-4)
    assert (alpha >= 3.0) == (expected[0] == [A, EOS])


def test_length_penalty_values():
    assert length_penalty(1, 0.0) == 1.0
    assert math.isclose(length_penalty(10, 0.6), (15 / 6) ** 0.6)
    assert length_penalty(torch.tensor([1, 7]), 1.0).tolist() == pytest.approx([1.0, 2.0])


@torch.inference_mode()
def test_nbest_is_sorted_consistent_and_distinct(model):
    src = random_sources([5, 7], seed=5)
    out = beam_search(model, src, DecodeConfig(beam=5, lenpen=0.6, max_len_b=6, nbest=5))
    assert out.scores.shape == (2, 5)
    assert torch.all(out.scores[:, :-1] >= out.scores[:, 1:])
    torch.testing.assert_close(out.scores, out.log_probs / length_penalty(out.lengths.float(), 0.6))
    for i in range(2):
        hyps = [tuple(out.hypothesis(i, k)) for k in range(5)]
        assert len(set(hyps)) == 5


@torch.inference_mode()
@pytest.mark.parametrize("search", ["greedy", "beam", "sample"])
def test_max_length_is_respected_per_sentence(model, search):
    src = random_sources([6, 2, 4], seed=6)
    a, b = 0.5, 2
    limit = max_lengths(src, model.config, a, b)
    assert limit.tolist() == [math.floor(a * n + b) for n in (7, 3, 5)]
    if search == "greedy":
        out = greedy_search(model, src, DecodeConfig(max_len_a=a, max_len_b=b, min_len=100))
    elif search == "beam":
        out = beam_search(model, src, DecodeConfig(beam=3, lenpen=0.6, max_len_a=a, max_len_b=b, min_len=100, nbest=3))
    else:
        out = sample(model, src, seed=0, decode=DecodeConfig(max_len_a=a, max_len_b=b, min_len=100))
    # EOS is forbidden, so every hypothesis runs exactly to its own limit, PAD after it.
    assert torch.equal(out.lengths, limit[:, None].expand_as(out.lengths))
    for i, n in enumerate(limit.tolist()):
        assert torch.all(out.tokens[i, :, n:] == PAD)
        assert torch.all(out.tokens[i, :, :n] > EOS)  # no PAD, BOS or EOS inside


@torch.inference_mode()
def test_attention_rows_are_distributions_over_real_source_tokens(model):
    src = random_sources([6, 2], seed=7)
    plain = beam_search(model, src, DecodeConfig(beam=3, max_len_b=4, nbest=3))
    out = beam_search(model, src, DecodeConfig(beam=3, max_len_b=4, nbest=3), attention=AttentionChoice(-1, 1))
    assert torch.equal(plain.tokens, out.tokens)
    assert out.attention.shape == (*out.tokens.shape, src.shape[1])
    n = int(out.lengths[1, 0])
    rows = out.attention[1, 0, :n]
    torch.testing.assert_close(rows.sum(-1), torch.ones(n))
    assert torch.all(rows[:, 3:] == 0)  # sentence 1 has 3 real source positions
    greedy = greedy_search(model, src, DecodeConfig(max_len_b=4), attention=AttentionChoice(-1, None))
    torch.testing.assert_close(greedy.attention[0, 0, :2].sum(-1), torch.ones(2))


@torch.inference_mode()
def test_sampling_with_top_k_one_is_greedy(model):
    src = random_sources([5, 3, 8], seed=8)
    greedy = greedy_search(model, src, DecodeConfig(max_len_b=6))
    for kwargs in ({"top_k": 1}, {"top_p": 1e-6}, {"temperature": 1e-4}):
        out = sample(model, src, seed=123, decode=DecodeConfig(max_len_b=6), **kwargs)
        assert torch.equal(out.tokens, greedy.tokens)


@torch.inference_mode()
def test_sampling_is_reproducible_with_a_seed(model):
    src = random_sources([5, 3, 8], seed=9)
    first = sample(model, src, temperature=1.5, seed=7, decode=DecodeConfig(max_len_b=8))
    again = sample(model, src, temperature=1.5, seed=7, decode=DecodeConfig(max_len_b=8))
    other = sample(model, src, temperature=1.5, seed=8, decode=DecodeConfig(max_len_b=8))
    assert torch.equal(first.tokens, again.tokens)
    assert not torch.equal(first.tokens, other.tokens)


def test_filter_logits_top_k_and_top_p():
    logp = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    assert torch.isfinite(filter_logits(logp, top_k=2)).tolist() == [[True, True, False, False]]
    assert torch.isfinite(filter_logits(logp, top_p=0.8)).tolist() == [[True, True, False, False]]
    assert torch.isfinite(filter_logits(logp, top_p=0.81)).tolist() == [[True, True, True, False]]
    torch.testing.assert_close(filter_logits(logp).exp(), logp.exp())


@torch.inference_mode()
def test_pooled_cache_greedy_equals_rerunning_the_prefix_past_its_first_chunk():
    """Search uses the preallocated, recycled KV cache (inference.fast); past 16 positions its
    buffers grow, and the result still equals re-running the whole prefix."""
    model = tiny_transformer(seed=11)
    src = random_sources([9, 3, 6, 1], seed=11)
    fast = greedy_search(model, src, DecodeConfig(max_len_a=1.0, max_len_b=20))
    slow = greedy_search(model, src, DecodeConfig(max_len_a=1.0, max_len_b=20), use_cache=False)
    assert torch.equal(fast.tokens, slow.tokens)
    torch.testing.assert_close(fast.scores, slow.scores, rtol=0, atol=1e-4)


@pytest.mark.parametrize("v,k", [(8000, 8), (6400, 1), (37000, 10), (8003, 8), (40, 8)])
def test_topk_rows_matches_topk(v, k):
    from transduce.inference.search import topk_rows
    x = torch.randn(7, v, generator=torch.Generator().manual_seed(v))
    x[:, :3] = -math.inf
    values, index = topk_rows(x, k)
    expected = x.topk(k, dim=1)
    assert torch.equal(values, expected.values)
    assert torch.equal(x.gather(1, index), values)


@pytest.mark.parametrize("search", ["greedy", "beam", "sample"])
def test_search_works_with_gradients_enabled(search):
    """A model straight from training (grad mode on) decodes like one under inference_mode."""
    model = tiny_transformer(seed=12)
    src = random_sources([4, 2], seed=12)
    fns = {"greedy": lambda: greedy_search(model, src, DecodeConfig(max_len_b=5)),
           "beam": lambda: beam_search(model, src, DecodeConfig(beam=2, max_len_b=5, nbest=2)),
           "sample": lambda: sample(model, src, seed=1, decode=DecodeConfig(max_len_b=5))}
    assert torch.is_grad_enabled()
    out = fns[search]()
    with torch.inference_mode():
        expected = fns[search]()
    assert torch.equal(out.tokens, expected.tokens)
    assert not out.scores.requires_grad


@pytest.mark.parametrize("rows", [1, 3, 1000])
def test_scoring_in_row_blocks_changes_nothing(model, monkeypatch, rows):
    """best_tokens projects and scores SCORE_ROWS rows at a time on CPU; any block size gives
    the same search (values to float rounding, the same tokens)."""
    import transduce.inference.search as search_module

    src = random_sources([5, 3, 7, 2])
    want = beam_search(model, src, DecodeConfig(beam=3, nbest=3, max_len_b=6))
    monkeypatch.setattr(search_module, "SCORE_ROWS", rows)
    got = beam_search(model, src, DecodeConfig(beam=3, nbest=3, max_len_b=6))
    assert torch.equal(got.tokens, want.tokens) and torch.equal(got.lengths, want.lengths)
    torch.testing.assert_close(got.scores, want.scores)
    states = torch.randn(10, model.config.d_model)
    values, tokens = search_module.best_tokens(model, states, model.config, step=0, min_len=1, k=4)
    logp = search_module.step_log_probs(model.output_proj(states), model.config, 0, 1)
    ref = logp.topk(4, dim=1)
    torch.testing.assert_close(values, ref.values)
    assert torch.equal(tokens, ref.indices)
    assert bool((tokens != model.config.eos_id).all())  # min_len forbids EOS at step 0
