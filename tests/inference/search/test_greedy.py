"""Greedy search, beam search and sampling on id tensors: equivalences and designed cases."""

from __future__ import annotations


import torch

from inference_helpers import assert_same_search, random_sources, tiny_transformer
from transduce.config import DecodeConfig
from transduce.inference import greedy_search

A, B, C = 4, 5, 6


@torch.inference_mode()
def test_cached_greedy_equals_rerunning_the_prefix():
    model = tiny_transformer(seed=4)
    src = random_sources([4, 8, 2], seed=4)
    cached = greedy_search(model, src, DecodeConfig(max_len_a=0.0, max_len_b=12, min_len=12))
    uncached = greedy_search(model, src, DecodeConfig(max_len_a=0.0, max_len_b=12, min_len=12), use_cache=False)
    assert_same_search(uncached, cached, log_probs=(0, 1e-4))

@torch.inference_mode()
def test_pooled_cache_greedy_equals_rerunning_the_prefix_past_its_first_chunk():
    """Search uses the preallocated, recycled KV cache (inference.speed.cache); past 16 positions its
    buffers grow, and the result still equals re-running the whole prefix."""
    model = tiny_transformer(seed=11)
    src = random_sources([9, 3, 6, 1], seed=11)
    fast = greedy_search(model, src, DecodeConfig(max_len_a=1.0, max_len_b=20))
    slow = greedy_search(model, src, DecodeConfig(max_len_a=1.0, max_len_b=20), use_cache=False)
    assert_same_search(slow, fast, scores=(0, 1e-4))


@torch.inference_mode()
def test_greedy_without_a_kept_history_equals_greedy_with_one():
    """Without streaming, repetition controls or the uncached path, greedy search keeps only each
    row's last token (no growing history); with a step hook it keeps the history. Same kernels
    on both sides, so the outputs are identical, rows finishing at different steps included."""
    model = tiny_transformer(seed=5)
    src = random_sources([7, 2, 5, 3], seed=5)
    decode = DecodeConfig(max_len_a=1.0, max_len_b=6)
    seen = []
    plain = greedy_search(model, src, decode)
    hooked = greedy_search(model, src, decode, on_step=lambda rows, tokens, n: seen.append(tokens.shape[1]))
    assert seen == list(range(1, len(seen) + 1))  # the hook saw the whole history each step
    assert torch.equal(plain.tokens, hooked.tokens) and torch.equal(plain.lengths, hooked.lengths)
    assert torch.equal(plain.scores, hooked.scores)
