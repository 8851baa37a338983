"""Greedy search, beam search and sampling on id tensors: equivalences and designed cases."""

from __future__ import annotations

import math

import pytest
import torch

from inference_helpers import BOS, EOS, PAD, MarkovModel, assert_same_search, random_sources, tiny_transformer
from transduce.config import DecodeConfig
from transduce.inference import beam_search, greedy_search, length_penalty

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
    assert_same_search(greedy, beam, log_probs=(0, 1e-5))

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
