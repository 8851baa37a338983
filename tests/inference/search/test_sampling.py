"""Greedy search, beam search and sampling on id tensors: equivalences and designed cases."""

from __future__ import annotations


import torch

from inference_helpers import random_sources
from transduce.config import DecodeConfig
from transduce.inference import greedy_search, sample
from transduce.inference.search.sampling import filter_logits

A, B, C = 4, 5, 6


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
