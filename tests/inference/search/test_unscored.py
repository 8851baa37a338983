"""Greedy search unscored (``SearchSpec(scores=False)``, what ``Translator.translate`` asks for):
each step takes the largest forbidden-masked logit, no softmax over the vocabulary; the same
tokens as scored greedy search, scores 0; beam search (and so reranking) scores anyway."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from inference_helpers import random_sources, tiny_transformer
from transduce.config import DecodeConfig
from transduce.inference import SearchSpec, Translator, prepare_for_decoding
from transduce.inference.search import static_shapes as static_module
from transduce.inference.search.common import best_tokens
from transduce.inference.speed import compile_step

LENGTHS = [3, 9, 1, 14, 6, 2, 11]
DECODES = [DecodeConfig(beam=1, max_len_a=1.0, max_len_b=5),
           DecodeConfig(beam=1, max_len_a=0.0, max_len_b=8, min_len=6),          # EOS forbidden at first
           DecodeConfig(beam=1, max_len_a=1.0, max_len_b=5, repetition_penalty=1.5, no_repeat_ngram_size=2)]


def _same_tokens(scored, unscored) -> None:
    assert torch.equal(scored.tokens, unscored.tokens)
    assert torch.equal(scored.lengths, unscored.lengths)
    assert (scored.scores < 0).all()                         # (the scored search's log-probs)
    assert (unscored.scores == 0).all() and (unscored.log_probs == 0).all()


@pytest.mark.parametrize("decode", DECODES, ids=["plain", "min_len", "repetition"])
@pytest.mark.parametrize("static", [False, True], ids=["eager", "static"])
def test_unscored_greedy_gives_the_scored_tokens(decode, static):
    model = prepare_for_decoding(tiny_transformer(seed=3, max_positions=64))
    src = random_sources(LENGTHS, seed=4)
    with torch.inference_mode():
        scored = SearchSpec(decode, static=static).run(model, src)
        unscored = SearchSpec(decode, static=static, scores=False).run(model, src)
    _same_tokens(scored, unscored)


@pytest.mark.skipif(shutil.which(os.environ.get("CXX") or "g++") is None,
                    reason="torch.compile's CPU kernels need a C++ compiler (g++, or CXX)")
def test_unscored_compiled_greedy_gives_the_scored_tokens():
    """The compiled step keeps a search per setting: scored and unscored ones do not mix."""
    torch._dynamo.reset()
    static_module._compiled_step.cache_clear()
    try:
        model = compile_step(prepare_for_decoding(tiny_transformer(seed=5, max_positions=64, n_encoder_layers=1,
                                                                   n_decoder_layers=1)))
        src = random_sources(LENGTHS, seed=6)
        decode = DECODES[1]
        with torch.inference_mode():
            eager = SearchSpec(decode, static=False).run(model, src)
            unscored = SearchSpec(decode, scores=False).run(model, src)
            scored = SearchSpec(decode).run(model, src)
        _same_tokens(eager, unscored)
        assert torch.allclose(scored.scores, eager.scores, atol=1e-5)  # (not the unscored search's zeros)
        assert {key[-1] for key in static_module._searches(model)} == {False, True}
    finally:
        torch._dynamo.reset()
        static_module._compiled_step.cache_clear()


def test_only_a_choice_of_one_goes_unscored():
    model = tiny_transformer(seed=0)
    states = torch.randn(3, model.config.d_model)
    with pytest.raises(ValueError, match="k=2"):
        best_tokens(model, states, model.config, 0, 0, 2, scored=False)
    with torch.inference_mode():  # beam search ignores the setting: it ranks by its scores
        beam = DecodeConfig(beam=3, max_len_a=1.0, max_len_b=4)
        src = random_sources(LENGTHS, seed=1)
        a = SearchSpec(beam, static=False).run(model, src)
        b = SearchSpec(beam, static=False, scores=False).run(model, src)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.scores, b.scores)


def test_translate_is_unscored_and_translate_detailed_scored(model_dir):
    translator = Translator.load(model_dir)
    texts = ["the cat sat on the mat", "", "a dog runs", "tea"]
    detailed = translator.translate_detailed(texts, beam=1, max_len_b=6)
    assert translator.translate(texts, beam=1, max_len_b=6) == [t.best.text for t in detailed]
    assert all(t.best.score < 0 for t in detailed if t.source_tokens)
    bare = translator.translate_detailed(texts, beam=1, max_len_b=6, scores=False)
    assert [t.best.text for t in bare] == [t.best.text for t in detailed]
    assert all(t.best.score == 0 for t in bare)
    beam = translator.translate_detailed(texts, beam=2, nbest=2, max_len_b=6, scores=False, rerank="mbr")
    assert all(h.score < 0 for t in beam if t.source_tokens for h in t.hypotheses)  # (beam search ranks by them)
