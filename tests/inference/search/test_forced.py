"""Forced decoding (inference/search/forced.py): the score of a given output equals the score
the searches report for it."""

from __future__ import annotations

import pytest
import torch

from inference_helpers import EOS, PAD, random_sources, tiny_transformer
from transduce.config import DecodeConfig
from transduce.inference import SearchSpec
from transduce.inference.search.forced import force_decode

LENGTHS = [3, 9, 1, 14, 6]
SETTINGS = [  # beam, lenpen, min_len, no_repeat_ngram_size, repetition_penalty, max_len_b
    (4, 0.6, 0, 0, 1.0, 20),
    (3, 1.0, 4, 2, 1.0, 20),
    (4, 0.6, 0, 0, 1.4, 20),
    (2, 0.0, 0, 3, 1.2, 3),  # outputs cut at the length limit, without EOS
    (1, 0.6, 2, 2, 1.3, 20),  # greedy: scores are plain log-probs, compare those
]


@pytest.mark.parametrize("beam,lenpen,min_len,ngram,penalty,max_len_b", SETTINGS)
def test_forced_scores_equal_the_search_scores(beam, lenpen, min_len, ngram, penalty, max_len_b):
    model = tiny_transformer(seed=3, tie_output=False)
    with torch.no_grad():
        model.output_proj.weight[EOS] *= 3.0  # some outputs end early
    src = random_sources(LENGTHS, seed=3)
    decode = DecodeConfig(beam=beam, nbest=beam, lenpen=lenpen, min_len=min_len, no_repeat_ngram_size=ngram,
                          repetition_penalty=penalty, max_len_b=max_len_b)
    with torch.inference_mode():
        out = SearchSpec(decode, static=False).run(model, src)
        for k in range(beam):
            forced = force_decode(model, src, out.tokens[:, k], decode)
            torch.testing.assert_close(forced.log_probs, out.log_probs[:, k], rtol=0, atol=1e-4)
            assert torch.equal(forced.lengths, out.lengths[:, k])
            if beam > 1:
                torch.testing.assert_close(forced.scores, out.scores[:, k], rtol=0, atol=1e-4)


def test_token_log_probs_sum_and_padding():
    model = tiny_transformer(seed=4)
    src = random_sources([4, 7], seed=4)
    tgt = torch.tensor([[5, 6, 7, EOS], [EOS, PAD, PAD, PAD]])  # the second: the empty output
    with torch.inference_mode():
        forced = force_decode(model, src, tgt)
    assert forced.lengths.tolist() == [4, 1]
    assert forced.token_log_probs[1, 1:].eq(0).all()
    torch.testing.assert_close(forced.token_log_probs.sum(1), forced.log_probs)
    assert (forced.token_log_probs[:, 0] < 0).all()
