"""MBR reranking of n-best lists (inference/search/rerank.py)."""

from __future__ import annotations

import pytest
import sacrebleu

from transduce.config import DecodeConfig
from transduce.errors import ConfigError
from transduce.inference.search.rerank import expected_utilities, mbr_rerank
from transduce.inference.translator import Hypothesis, Translation


def _translation(texts: list[str], log_probs: list[float]) -> Translation:
    return Translation("src", [5], ["x"], [Hypothesis(t, [], [], lp, lp) for t, lp in zip(texts, log_probs)])


@pytest.mark.parametrize("utility", ["chrf", "bleu"])
def test_mbr_prefers_the_consensus_over_the_most_probable(utility):
    t = _translation(["the cat eats the red fish", "the cat eats the fish", "the cat eats a red fish",
                      "a dog sleeps under the tree"], [-1.0, -1.1, -1.2, -0.5])
    mbr_rerank(t, utility)
    assert t.best.text == "the cat eats the red fish"  # not the most probable (-0.5), an outlier
    assert [h.utility for h in t.hypotheses] == sorted((h.utility for h in t.hypotheses), reverse=True)


def test_expected_utility_is_the_probability_weighted_mean():
    texts, log_probs = ["a b c d", "a b x y", "q r s t"], [-0.5, -1.0, -3.0]
    got = expected_utilities(texts, log_probs, "chrf")
    weights = [2.718281828459045 ** lp for lp in log_probs]
    want = [sum(w * sacrebleu.sentence_chrf(h, [r]).score for w, r in zip(weights, texts)) / sum(weights)
            for h in texts]
    assert got == pytest.approx(want, rel=1e-9)


def test_one_hypothesis_is_left_alone():
    t = _translation(["only"], [-1.0])
    mbr_rerank(t, "chrf")
    assert t.best.utility is None


@pytest.mark.parametrize("kwargs,key", [(dict(rerank="mbr"), "decode.rerank"),
                                        (dict(rerank="mbr", nbest=2, beam=2, mbr_utility="ter"), "decode.mbr_utility"),
                                        (dict(rerank="reverse"), "decode.rerank")])
def test_bad_rerank_settings_are_one_line_errors(kwargs, key):
    with pytest.raises(ConfigError, match=key):
        DecodeConfig(**kwargs)


def test_sampled_pool_weighs_each_draw_once_and_keeps_a_text_once():
    t = _translation(["a b c", "a b c", "a b d", "x y z"], [-9.0, -9.0, -0.1, -0.1])
    mbr_rerank(t, "chrf", samples=True)
    assert [h.text for h in t.hypotheses][0] == "a b c"  # drawn twice: the consensus, whatever its log-prob
    assert len(t.hypotheses) == 3


def test_mbr_over_samples_needs_two(model_dir):
    from transduce.inference import Translator

    tr = Translator.load(model_dir)
    out = tr.translate_detailed(["the cat", ""], rerank="mbr", mbr_samples=3, max_len_b=5)
    assert 1 <= len(out[0].hypotheses) <= 3 and out[0].best.utility is not None and out[1].best.text == ""
    assert tr.translate(["the cat"], rerank="mbr", mbr_samples=3, max_len_b=5) == [out[0].best.text]  # seeded
    with pytest.raises(ConfigError, match="decode.rerank"):
        DecodeConfig(rerank="mbr", mbr_samples=1)
