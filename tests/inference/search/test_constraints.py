"""Lexically constrained beam search (inference/search/constraints.py): every constraint
appears, scores stay the model's own, bank order as dynamic beam allocation says."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from torch import Tensor

from inference_helpers import EOS, random_sources, tiny_transformer
from transduce.config import DecodeConfig
from transduce.errors import ConfigError
from transduce.inference import SearchSpec
from transduce.inference.search.constraints import ConstraintBeams, bank_order, constraint_ids, ready_to_complete
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
    rows, lengths, _ = state.sentence_rows(torch.tensor([0]))
    trace = []
    for token in [5, 6, 8, 5, 6, 7, 9]:  # "5 6" interrupted by 8, then "5 6 7" and "9"
        met, cur, done = state.step(rows, lengths, torch.tensor([token]))
        state = replace(state, met=met, cur=cur, done=done)
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


def _count(ids: list[int], phrase: list[int]) -> int:
    return sum(ids[i:i + len(phrase)] == phrase for i in range(len(ids) - len(phrase) + 1))


def _fond_of(tokens: list[int], seed: int = 0):
    """A tiny model whose every step prefers ``tokens`` (a bias on their logits): left alone it
    repeats them until its length limit."""
    model = tiny_transformer(seed=seed, tie_output=False)
    proj = torch.nn.Linear(model.output_proj.in_features, model.output_proj.out_features, bias=True)
    with torch.no_grad():
        proj.weight.copy_(model.output_proj.weight)
        proj.bias.zero_()
        proj.bias[tokens] = 6.0
    model.output_proj = proj
    return model


@pytest.mark.parametrize("beam", [1, 4])
def test_a_met_constraint_is_not_produced_again_unless_given_twice(beam):
    phrase = [5]
    model, src = _fond_of(phrase), random_sources([6, 9, 4], seed=1)
    decode = DecodeConfig(beam=beam, nbest=beam, max_len_a=1.0, max_len_b=10)
    with torch.inference_mode():
        plain = SearchSpec(decode).run(model, src)
        once = SearchSpec(decode).run(model, src, constraints=constraint_ids([[phrase]] * 3))
        twice = SearchSpec(decode).run(model, src, constraints=constraint_ids([[phrase, phrase]] * 3))
    for i in range(3):
        assert _count(plain.hypothesis(i), phrase) >= 2  # the model alone repeats it
        for k in range(beam):
            if once.scores[i, k] > -math.inf:
                assert _count(once.hypothesis(i, k), phrase) == 1, once.hypothesis(i, k)
            if twice.scores[i, k] > -math.inf:
                assert _count(twice.hypothesis(i, k), phrase) == 2, twice.hypothesis(i, k)
        assert once.scores[i, 0] > -math.inf and twice.scores[i, 0] > -math.inf


def test_a_met_phrase_does_not_block_a_longer_one_that_ends_with_it():
    model, src = _fond_of([5]), random_sources([6, 9], seed=1)
    decode = DecodeConfig(beam=4, max_len_a=1.0, max_len_b=10)
    with torch.inference_mode():
        out = SearchSpec(decode).run(model, src, constraints=constraint_ids([[[5], [8, 5]]] * 2))
    for i in range(2):
        assert _contains(out.hypothesis(i), [8, 5]) and _contains(out.hypothesis(i), [5])


def _follow(phrases: list[list[int]], output: list[int]) -> tuple[ConstraintBeams, Tensor, Tensor, Tensor]:
    """The state after ``output``, each phrase met wherever the output comes to end with it."""
    ids = constraint_ids([phrases])
    state = ConstraintBeams.start(ids)
    rows, lengths, copies = state.sentence_rows(torch.tensor([0]))
    for t, token in enumerate(output):
        ready = ready_to_complete(rows, lengths, torch.tensor([output[:t]]))
        met, cur, done = state.step(rows, lengths, torch.tensor([token]), ready, copies)
        state = replace(state, met=met, cur=cur, done=done)
    return state, rows, lengths, copies


def test_copies_are_the_same_phrases_of_each_sentence():
    state = ConstraintBeams.start(constraint_ids([[[5, 6], [9], [5, 6]], [[9], [9, 4]]]))
    phrases = state.phrases
    assert torch.equal(state.copies, (phrases.unsqueeze(2) == phrases.unsqueeze(1)).all(dim=3))
    assert state.copies[0].tolist() == [[True, False, True], [False, True, False], [True, False, True]]
    rows, _, copies = state.sentence_rows(torch.tensor([1, 0]))  # one row per sentence here
    assert torch.equal(rows, phrases[[1, 0]]) and torch.equal(copies, state.copies[[1, 0]])


def test_a_phrase_is_met_wherever_the_output_ends_with_it():
    state, *_ = _follow([[4, 5], [4, 6], [6, 7, 8], [7], [7]], [4, 6, 7, 8])
    assert state.met.tolist() == [[False, True, True, True, False]]  # "4 6" begun as "4 5"; "7" inside "6 7 8", once
    state, *_ = _follow([[5], [5]], [5, 9, 5])
    assert state.met.tolist() == [[True, True]]


def test_repeats_names_the_completing_token_of_spent_phrases():
    state, rows, lengths, copies = _follow([[5, 6], [9], [9]], [5, 6, 9])   # "9" given twice
    extra = state.next_tokens(rows, lengths)
    ready = ready_to_complete(rows, lengths, torch.tensor([[5, 6, 9, 5]]))
    assert state.repeats(rows, lengths, copies, ready, extra).tolist() == [[6, -1, -1]]  # "5 6" spent, "9" not
    ready = ready_to_complete(rows, lengths, torch.tensor([[5, 6, 9, 4]]))
    assert state.repeats(rows, lengths, copies, ready, extra).tolist() == [[-1, -1, -1]]


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_each_phrase_appears_as_often_as_it_is_given(seed):
    """Random phrases, some given twice: a phrase whose tokens no other phrase shares (so that
    it cannot be met inside another one) appears exactly as many times as it is given."""
    model, src = _model(seed), random_sources(LENGTHS, seed=seed)
    phrases = [p + p[:1] for p in _phrases(seed + 10, len(LENGTHS))]     # the first phrase twice
    with torch.inference_mode():
        out = SearchSpec(DecodeConfig(beam=4, max_len_a=1.0, max_len_b=20)).run(
            model, src, constraints=constraint_ids(phrases))
    checked = 0
    for i, sentence in enumerate(phrases):
        for p in sentence:
            others = {t for q in sentence if q != p for t in q}
            if len(set(p)) == len(p) and not others & set(p):
                assert _count(out.hypothesis(i), p) == sentence.count(p), (i, p, sentence, out.hypothesis(i))
                checked += 1
    assert checked >= 3


def _followers(ids: list[int], phrase: list[int]) -> list[int]:
    """The token after each occurrence of ``phrase`` in ``ids`` (EOS where it ends the output)."""
    n = len(phrase)
    return [(ids + [EOS])[i + n] for i in range(len(ids) - n + 1) if ids[i:i + n] == phrase]


@pytest.mark.parametrize("beam", [1, 4])
@pytest.mark.parametrize("phrase", [[5], [9, 5]])
def test_with_the_word_table_a_constraint_is_not_glued_to_a_suffix(beam, phrase):
    """A model fond of a word-continuing piece (7, think ``es``) glues it to the constraint
    (``▁Hund`` + ``es``: the tokens met, the word "Hund" missed); given the table of such pieces
    the search ends the word there, and scores stay the model's own."""
    model, src = _fond_of([7]), random_sources([6, 9, 4], seed=1)
    inside = torch.zeros(40, dtype=torch.bool)
    inside[[7, 11, 12, 13]] = True                                         # pieces that continue a word
    decode = DecodeConfig(beam=beam, nbest=beam, max_len_a=1.0, max_len_b=10)
    ids = constraint_ids([[phrase]] * 3)
    with torch.inference_mode():
        tokens = SearchSpec(decode).run(model, src, constraints=ids)
        words = SearchSpec(decode).run(model, src, constraints=ids, inside=inside)
        forced = force_decode(model, src, words.tokens[:, 0], decode)
    glued = [t for i in range(3) for t in _followers(tokens.hypothesis(i), phrase)]
    assert any(inside[t] for t in glued), glued                           # the case arises without the table
    for i in range(3):
        for k in range(beam):
            if words.scores[i, k] > -math.inf:
                after = _followers(words.hypothesis(i, k), phrase)
                assert after and not any(inside[t] for t in after), (words.hypothesis(i, k), after)
        assert words.scores[i, 0] > -math.inf
    torch.testing.assert_close(forced.log_probs, words.log_probs[:, 0], rtol=0, atol=1e-4)
