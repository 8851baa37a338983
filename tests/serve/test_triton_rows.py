"""The Triton model's request handling (:mod:`transduce.inference.backends.triton`) without Triton: rows
checked one by one, requests of equal settings translated together as the Translator does."""

from __future__ import annotations

import numpy as np
import pytest

from toy_model import toy_pairs
from transduce.errors import TransduceError
from transduce.inference.backends.triton import TritonTranslate, number

SENTENCES = [s for s, _ in toy_pairs(6, seed=3)]


@pytest.fixture(scope="module")
def model(trained_dir):
    from transduce.inference import load

    m = TritonTranslate(load(trained_dir), max_chars=100)
    yield m
    m.close()


def _rows(texts):
    return np.array([t.encode() if isinstance(t, str) else t for t in texts], dtype=object).reshape(-1, 1)


def test_a_batch_of_requests_is_the_translators_output(model):
    requests = [model.rows(_rows(SENTENCES[:2]), {}), model.rows(_rows(SENTENCES[2:]), {"beam": 2, "nbest": 2}),
                model.rows(_rows(SENTENCES[5:]), {})]
    first, second, third = model.answer(requests)
    assert [x.decode() for x in first["translation"][:, 0]] == model.translator.translate(SENTENCES[:2])
    assert [x.decode() for x in third["translation"][:, 0]] == model.translator.translate(SENTENCES[5:])
    expected = model.translator.translate_detailed(SENTENCES[2:], beam=2, nbest=2)
    assert second["translation"].shape == second["score"].shape == (4, 2)
    assert [[x.decode() for x in row] for row in second["translation"]] == \
        [[h.text for h in t.hypotheses] for t in expected]


def test_bad_rows_keep_their_place(model):
    out, = model.answer([model.rows(_rows([SENTENCES[0], "  ", b"\xc3\x28", "x" * 101, SENTENCES[1]]), {})])
    errors = [e.decode() for e in out["error"][:, 0]]
    assert errors[0] == errors[4] == "" and "empty" in errors[1] and "UTF-8" in errors[2] and "101" in errors[3]
    assert [x.decode() for x in out["translation"][[0, 4], 0]] == model.translator.translate(SENTENCES[:2])
    assert np.isnan(out["score"][1:4, 0]).all() and out["translation"][1, 0] == b""


@pytest.mark.parametrize("name, value, parsed", [("beam", 3, 3), ("beam", "3", 3), ("lenpen", "0.5", 0.5),
                                                 ("lenpen", 1, 1.0), ("max_len_a", 1.5, 1.5)])
def test_parameters_are_read_as_their_fields_type(name, value, parsed):
    assert number(name, value) == parsed and type(number(name, value)) is type(parsed)


@pytest.mark.parametrize("name, value", [("beam", 2.5), ("beam", True), ("beam", "two"), ("lenpen", "x"),
                                         ("nbest", None)])
def test_bad_parameters_are_refused(name, value):
    with pytest.raises(TransduceError, match=name):
        number(name, value)
