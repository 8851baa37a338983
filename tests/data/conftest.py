"""Shared fixtures for the data tests: a toy corpus and a tokenizer trained on it."""

import pytest

from transduce.data.tokenizer import Tokenizer
from transduce.data.toy import generate_pairs


@pytest.fixture(scope="session")
def toy_pairs() -> list[tuple[str, str]]:
    return generate_pairs(3000, seed=11)


@pytest.fixture(scope="session")
def toy_tokenizer(toy_pairs, tmp_path_factory) -> Tokenizer:
    out = tmp_path_factory.mktemp("toy_tok")
    return Tokenizer.train([s for s, _ in toy_pairs], [t for _, t in toy_pairs], out,
                           vocab_size=500, model_type="bpe", joint=True)
