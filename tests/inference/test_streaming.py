"""stream_translation: the deltas joined are the plain translation (greedy and beam search)."""

from __future__ import annotations

import pytest

from toy_model import toy_pairs
from transduce.errors import ConfigError
from transduce.inference import Translator
from transduce.inference.streaming import stream_translation


@pytest.fixture(scope="module")
def translator(trained_dir):
    with Translator.load(trained_dir) as tr:
        yield tr


@pytest.mark.parametrize("beam", [1, 4])
def test_the_stream_joined_is_the_translation(translator, beam):
    sentences = [s for s, _ in toy_pairs(12, seed=5)] + [""]
    streamed = 0
    for s in sentences:
        parts: list[str] = []
        result = stream_translation(translator, s, parts.append, beam=beam)
        assert "".join(parts) == result == translator.translate([s], beam=beam)[0]
        assert all(parts)
        streamed += len(parts) > 1
    assert streamed > 6  # most translations arrive in several pieces, not all at the end


def test_reranking_does_not_stream(translator):
    with pytest.raises(ConfigError, match="rerank"):
        stream_translation(translator, "the dog runs", print, translator.settings(rerank="mbr", nbest=4))
