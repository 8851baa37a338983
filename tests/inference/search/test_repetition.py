"""Repetition controls (inference/search/repetition.py): n-gram blocking and the CTRL penalty, in
every search; outputs unchanged when off is the other search tests' job."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from inference_helpers import random_sources, tiny_transformer
from transduce.config import DecodeConfig
from transduce.errors import ConfigError
from transduce.inference import SearchSpec
from transduce.inference.search.dispatch import check_speculative
from transduce.inference.search.repetition import Repetition

LENGTHS = [3, 9, 1, 14, 6]


def _ngrams(ids: list[int], n: int) -> list[tuple[int, ...]]:
    return [tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)]


def _repeats(out, n: int) -> int:
    """How many hypotheses of a SearchOutput repeat an n-gram."""
    bad = 0
    for i in range(out.tokens.shape[0]):
        for k in range(out.tokens.shape[1]):
            grams = _ngrams(out.hypothesis(i, k), n)
            bad += len(grams) != len(set(grams))
    return bad


SPECS = {
    "greedy": dict(decode=dict(beam=1)),
    "beam": dict(decode=dict(beam=4, nbest=4)),
    "sampling": dict(decode=dict(beam=1), temperature=0.3, seed=3),
    "static_greedy": dict(decode=dict(beam=1), static=True),
    "static_beam": dict(decode=dict(beam=3, nbest=3), static=True),
}


@pytest.mark.parametrize("name", SPECS)
@pytest.mark.parametrize("n", [1, 2, 3])
def test_no_repeated_ngram_in_any_output(name, n):
    model = tiny_transformer(seed=1, tie_output=False)
    src = random_sources(LENGTHS, seed=1)
    spec = dict(SPECS[name])
    decode = DecodeConfig(max_len_b=20, min_len=15, **spec.pop("decode"))
    with torch.inference_mode():
        assert _repeats(SearchSpec(decode, **spec).run(model, src), n) > 0  # a random model repeats: the test has teeth
        blocked = SearchSpec(replace(decode, no_repeat_ngram_size=n), **spec).run(model, src)
    assert _repeats(blocked, n) == 0


def _block_reference(history: list[int], n: int, vocab: int) -> set[int]:
    """The tokens that would repeat an n-gram of ``history``, by brute force."""
    if len(history) < n - 1:
        return set()
    last = tuple(history[len(history) - n + 1:]) if n > 1 else ()
    return {g[-1] for g in _ngrams(history, n) if g[:-1] == last}


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("length", [0, 1, 2, 5, 9])
def test_block_matches_brute_force_eager_and_padded(n, length):
    g = torch.Generator().manual_seed(n * 10 + length)
    history = torch.randint(4, 9, (6, length), generator=g)               # few tokens: many repeats
    decode = DecodeConfig(no_repeat_ngram_size=n)
    padded = torch.cat([history, torch.zeros(6, 7, dtype=torch.long)], dim=1)  # static: a wider buffer
    for repeat in (Repetition.of(decode, history), Repetition.of(decode, padded, torch.tensor(length))):
        blocked = repeat.block(torch.zeros(6, 10))
        for row in range(6):
            want = _block_reference(history[row].tolist(), n, 10)
            assert {t for t in range(10) if blocked[row, t] == -math.inf} == want


def test_penalty_matches_ctrl_in_float64():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 12, generator=g, dtype=torch.float64)
    history = torch.tensor([[4, 5, 4], [0, 0, 0], [11, 7, 2]])
    out = Repetition.of(DecodeConfig(repetition_penalty=1.3), history).penalise(logits)
    want = logits.clone()
    for row, seen in enumerate(history.tolist()):
        for t in set(seen):
            want[row, t] = logits[row, t] * 1.3 if logits[row, t] < 0 else logits[row, t] / 1.3
    torch.testing.assert_close(out, want, rtol=0, atol=0)


@pytest.mark.parametrize("beam", [1, 3])
def test_static_equals_eager_with_controls(beam):
    model = tiny_transformer(seed=2, tie_output=False)
    src = random_sources(LENGTHS, seed=2)
    decode = DecodeConfig(beam=beam, nbest=beam, max_len_b=15, no_repeat_ngram_size=2, repetition_penalty=1.5)
    with torch.inference_mode():
        eager = SearchSpec(decode, static=False).run(model, src)
        static = SearchSpec(decode, static=True).run(model, src)
    assert torch.equal(eager.tokens, static.tokens)
    torch.testing.assert_close(static.scores, eager.scores, rtol=1e-5, atol=1e-5)


def test_penalty_changes_beam_and_is_off_at_one():
    model = tiny_transformer(seed=1, tie_output=False)
    src = random_sources(LENGTHS, seed=1)
    with torch.inference_mode():
        plain = SearchSpec(DecodeConfig(max_len_b=20)).run(model, src)
        one = SearchSpec(DecodeConfig(max_len_b=20, repetition_penalty=1.0)).run(model, src)
        strong = SearchSpec(DecodeConfig(max_len_b=20, repetition_penalty=3.0)).run(model, src)
    assert torch.equal(plain.tokens, one.tokens)
    assert not torch.equal(plain.tokens, strong.tokens)


@pytest.mark.parametrize("key,value", [("no_repeat_ngram_size", -1), ("repetition_penalty", 0.0)])
def test_bad_settings_are_one_line_errors(key, value):
    with pytest.raises(ConfigError, match=f"decode.{key}"):
        DecodeConfig(**{key: value})


def test_speculative_refuses_the_controls():
    with pytest.raises(ConfigError, match="repetition"):
        check_speculative(DecodeConfig(beam=1, no_repeat_ngram_size=3))
