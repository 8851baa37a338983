"""The searches on models whose heads are not d_model / n_heads wide (``model.head_dim``): the
equivalences of the other search tests, on such a model."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

from inference_helpers import EOS, assert_same_search, random_sources, tiny_transformer
from transduce.config import DecodeConfig
from transduce.inference import SearchSpec, beam_search, greedy_search, prepare_for_decoding
from transduce.inference.search import Ensemble, Speculation, speculative_search

SRC = random_sources([5, 3, 9, 1, 7, 2], seed=4)
DECODE = DecodeConfig(max_len_a=1.0, max_len_b=6)


def _model(seed: int = 0, head_dim: int = 12, **kw):
    """A tiny random model with 4 heads of ``head_dim`` over d_model 32, ending some hypotheses early."""
    model = tiny_transformer(seed=seed, head_dim=head_dim, max_positions=64, tie_output=False, **kw)
    with torch.no_grad():
        model.output_proj.weight[EOS] *= 4.0
    return model


@torch.inference_mode()
@pytest.mark.parametrize("head_dim", [4, 12])
def test_beam_of_one_equals_greedy(head_dim):
    model = _model(head_dim=head_dim)
    greedy = greedy_search(model, SRC, DECODE)
    beam = beam_search(model, SRC, replace(DECODE, beam=1, lenpen=0.6, nbest=1))
    assert_same_search(greedy, beam, log_probs=(0, 1e-5), trim=True)  # (greedy pads to its length cap)


@torch.inference_mode()
@pytest.mark.parametrize("beam", [1, 3])
def test_static_and_prepared_searches_equal_the_eager_one(beam):
    """The speed layer's fused projections and pooled caches, and static decoding's buffers,
    take their head width from the model."""
    model = _model(seed=1)
    decode = replace(DECODE, beam=beam, nbest=beam)
    eager = SearchSpec(decode, static=False).run(model, SRC)
    prepared = prepare_for_decoding(copy.deepcopy(model))
    for static in (False, True):
        assert_same_search(eager, SearchSpec(decode, static=static).run(prepared, SRC),
                           scores=(1e-5, 1e-5), log_probs=(1e-5, 1e-5))


@torch.inference_mode()
def test_speculative_search_with_a_draft_of_other_heads_equals_greedy():
    model, draft = _model(seed=0, head_dim=12), _model(seed=2, head_dim=4, n_decoder_layers=1)
    spec = Speculation(draft)
    assert_same_search(greedy_search(model, SRC, DECODE),
                       speculative_search(model, SRC, spec, replace(DECODE, draft_tokens=3)),
                       log_probs=(0, 1e-4), trim=True)


@torch.inference_mode()
def test_an_ensemble_of_one_is_the_model():
    model = _model(seed=3)
    decode = replace(DECODE, beam=3, lenpen=0.6)
    assert_same_search(beam_search(model, SRC, decode), beam_search(Ensemble([model]), SRC, decode),
                       scores=(0, 1e-5))
