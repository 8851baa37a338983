"""The searches on a T5-style model (relative position bias in the decoder's cache, unscaled
attention, RMSNorm, GEGLU): the equivalences the other models pass, unchanged."""

from __future__ import annotations

import pytest
import torch

from inference_helpers import EOS, assert_same_search, random_sources, tiny_transformer
from transduce.config import DecodeConfig
from transduce.inference import SearchSpec, greedy_search
from transduce.inference.search.beam import beam_search

LENGTHS = [3, 9, 1, 14, 6, 2, 11]
T5 = dict(norm="pre", norm_kind="rms", positions="relative", relative_buckets=8, relative_max_distance=12,
          bias=False, scale_embeddings=False, scale_attention=False, layer_norm_eps=1e-6, max_positions=64)


def _model(seed: int, activation: str, **overrides):
    tied = activation == "relu"
    model = tiny_transformer(seed=seed, activation=activation, tie_output=tied, scale_output=tied, **T5, **overrides)
    with torch.no_grad():  # end some hypotheses early (tied: the EOS embedding row too)
        model.output_proj.weight[EOS] *= 2.0
    return model


def _assert_same(want, got) -> None:
    """The same hypotheses (over the narrower width), log-probabilities within float32 rounding
    of two paths through the same kernels; and a case that is not trivial."""
    assert len(set(want.lengths.flatten().tolist())) > 1
    assert_same_search(want, got, log_probs=(1e-5, 1e-5), trim=True)


@pytest.mark.parametrize("activation", ["relu", "geglu"])
def test_cached_greedy_equals_rerunning_the_prefix(activation):
    model = _model(0, activation)
    src = random_sources(LENGTHS, seed=1)
    decode = DecodeConfig(beam=1, max_len_a=1.0, max_len_b=6)
    with torch.inference_mode():
        _assert_same(greedy_search(model, src, decode, use_cache=False), greedy_search(model, src, decode))


@pytest.mark.parametrize("activation", ["relu", "geglu"])
@pytest.mark.parametrize("beam", [1, 4])
@pytest.mark.parametrize("bos_in_softmax", [True, False])  # (false: an imported T5's)
def test_static_search_equals_eager(activation, beam, bos_in_softmax):
    model = _model(1, activation, bos_in_softmax=bos_in_softmax)
    src = random_sources(LENGTHS, seed=2)
    decode = DecodeConfig(beam=beam, max_len_a=1.0, max_len_b=6)
    with torch.inference_mode():
        _assert_same(SearchSpec(decode, static=False).run(model, src), SearchSpec(decode, static=True).run(model, src))


def test_beam_of_one_equals_greedy_and_batches_like_each_sentence():
    model = _model(2, "geglu")
    src = random_sources(LENGTHS, seed=3)
    with torch.inference_mode():
        decode = DecodeConfig(beam=1, max_len_a=1.0, max_len_b=6, nbest=1)
        _assert_same(greedy_search(model, src, decode), beam_search(model, src, decode))
        batched = SearchSpec(DecodeConfig(beam=4)).run(model, src)
        for i in (0, 3):
            alone = SearchSpec(DecodeConfig(beam=4)).run(model, src[i:i + 1, : LENGTHS[i] + 1])
            n = int(alone.lengths[0, 0])
            assert torch.equal(batched.tokens[i, 0, :n], alone.tokens[0, 0, :n])
