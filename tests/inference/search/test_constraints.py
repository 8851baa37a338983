"""Lexically constrained beam search (inference/search/constraints.py): every constraint
appears, scores stay the model's own, bank order as dynamic beam allocation says."""

from __future__ import annotations

import math

import pytest
import torch

from inference_helpers import EOS, random_sources, tiny_transformer
from transduce.config import DecodeConfig
from transduce.errors import ConfigError
from transduce.inference import SearchSpec
from transduce.inference.search.constraints import ConstraintBeams, bank_order, constraint_ids
from transduce.inference.search.forced import force_decode

LENGTHS = [3, 9, 1, 14, 6, 5]


def _contains(ids: list[int], phrase: list[int]) -> bool:
    return any(ids[i:i + len(phrase)] == phrase for i in range(len(ids) - len(phrase) + 1))


def _phrases(seed: int, n: int) -> list[list[list[int]]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        count = int(torch.randint(0, 4, (1,), generator=g))  # 0-3 constraints, 1-3 tokens each
        out.append([torch.randint(4, 40, (int(torch.randint(1, 4, (1,), generator=g)),), generator=g).tolist()
                    for _ in range(count)])
    return out


def _model(seed: int):
    model = tiny_transformer(seed=seed, tie_output=False)
    with torch.no_grad():
        model.output_proj.weight[EOS] *= 3.0  # outputs end early: constraints must wait for EOS
    return model


@pytest.mark.parametrize("beam", [1, 2, 4])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("extra", [{}, {"no_repeat_ngram_size": 4, "repetition_penalty": 1.3}, {"max_len_b": 12}])
def test_every_constraint_appears_and_scores_are_the_models(beam, seed, extra):
    model, src = _model(seed), random_sources(LENGTHS, seed=seed)
    phrases = _phrases(seed, len(LENGTHS))
    decode = DecodeConfig(**{"beam": beam, "nbest": beam, "max_len_a": 1.0, "max_len_b": 20, **extra})
    with torch.inference_mode():
        out = SearchSpec(decode).run(model, src, constraints=constraint_ids(phrases))
        for k in range(beam):
            finite = out.scores[:, k] > -math.inf
            forced = force_decode(model, src, out.tokens[:, k], decode)
            torch.testing.assert_close(forced.log_probs[finite], out.log_probs[finite, k], rtol=0, atol=1e-4)
    for i, sentence in enumerate(phrases):
        assert out.scores[i, 0] > -math.inf  # the best hypothesis always meets them
        for k in range(beam):
            if out.scores[i, k] > -math.inf:
                assert all(_contains(out.hypothesis(i, k), p) for p in sentence), (i, k, sentence)


def test_without_constraints_the_output_is_plain_beam_search():
    model, src = _model(0), random_sources(LENGTHS, seed=0)
    decode = DecodeConfig(beam=4, nbest=2)
    with torch.inference_mode():
        plain = SearchSpec(decode).run(model, src)
        none = SearchSpec(decode).run(model, src, constraints=constraint_ids([[] for _ in LENGTHS]))
        empty = SearchSpec(decode).run(model, src, constraints=constraint_ids([[[5]]] + [[] for _ in LENGTHS[1:]]))
    assert none is not None and torch.equal(plain.tokens, none.tokens)
    assert _contains(empty.hypothesis(0), [5])


def test_constraints_longer_than_the_limit_are_a_one_line_error():
    model, src = _model(0), random_sources([2, 3], seed=0)
    ids = constraint_ids([[[5, 6, 7]], [[5] * 10]])
    with pytest.raises(ConfigError, match="constraints: sentence 2 needs 10 tokens.*limit of 7"):
        SearchSpec(DecodeConfig(max_len_a=1.0, max_len_b=3)).run(model, src, constraints=ids)


@pytest.mark.parametrize("spec", [dict(temperature=1.0), dict(static=True)])
def test_constraints_refuse_sampling_and_static(spec):
    model, src = _model(0), random_sources([2], seed=0)
    with pytest.raises(ConfigError, match="constrained decoding"):
        SearchSpec(DecodeConfig(), **spec).run(model, src, constraints=constraint_ids([[[5]]]))


def test_progress_follows_the_output():
    phrases = constraint_ids([[[5, 6, 7], [9]]])                          # (1, 2, 3)
    state = ConstraintBeams.start(phrases)
    rows, lengths = state.sentence_rows(torch.tensor([0]))
    trace = []
    for token in [5, 6, 8, 5, 6, 7, 9]:  # "5 6" interrupted by 8, then "5 6 7" and "9"
        met, cur, done = state.step(rows, lengths, torch.tensor([token]))
        state = ConstraintBeams(phrases, met, cur, done)
        trace.append(int(state.progress(lengths, met, done)))
    assert trace == [1, 2, 0, 1, 2, 3, 4]
    assert bool(state.all_met(lengths, state.met))


def test_bank_order_is_round_robin_fullest_first():
    scores = torch.tensor([[-1.0, -2.0, -3.0, -4.0, -5.0, -math.inf]])
    bank = torch.tensor([[0, 0, 1, 2, 2, 2]])
    order = bank_order(scores, bank, 6)[0].tolist()
    assert order[:5] == [0, 3, 2, 4, 1]  # the best of all (bank 0); best of bank 2, 1; second best of 2, 0
    assert order[5] == 5                  # -inf last
    assert bank_order(scores, bank, 6, best_first=False)[0].tolist()[:5] == [3, 2, 0, 4, 1]  # plain round-robin
