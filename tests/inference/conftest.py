"""Fixtures for the inference tests (helpers live in ``inference_helpers``)."""

from __future__ import annotations

import pytest

from inference_helpers import tiny_transformer
from transduce.model import Transformer


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_thread):
    yield


@pytest.fixture
def model() -> Transformer:
    return tiny_transformer()
