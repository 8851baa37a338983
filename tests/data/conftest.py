"""Shared fixtures for the data tests: a toy corpus, a tokenizer trained on it, Multi30k."""

import os
from pathlib import Path

import pytest

from transduce.data.tokenizer import Tokenizer
from transduce.data.toy import generate_pairs


def _multi30k_dir() -> Path:
    env = os.environ.get("TRANSDUCE_MULTI30K", "").strip()
    if env:
        return Path(env)
    # the shared data directory beside the repository root; never copied into the repo
    return (Path(__file__).resolve().parents[2] / "../shared/data/multi30k").resolve()


@pytest.fixture(scope="session")
def multi30k_root() -> Path:
    root = _multi30k_dir()
    if not (root / "train.en.gz").is_file():
        pytest.skip(f"Multi30k not found at {root} (set TRANSDUCE_MULTI30K to its directory)")
    return root


@pytest.fixture(scope="session")
def toy_pairs() -> list[tuple[str, str]]:
    return generate_pairs(3000, seed=11)


@pytest.fixture(scope="session")
def toy_tokenizer(toy_pairs, tmp_path_factory) -> Tokenizer:
    out = tmp_path_factory.mktemp("toy_tok")
    return Tokenizer.train([s for s, _ in toy_pairs], [t for _, t in toy_pairs], out,
                           vocab_size=500, model_type="bpe", joint=True)
