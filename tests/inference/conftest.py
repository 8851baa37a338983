"""Fixtures for the inference tests (helpers live in ``inference_helpers``)."""

from __future__ import annotations

import pytest
import torch

from inference_helpers import tiny_transformer
from transduce.model import Transformer


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models gain nothing from threads, and on a busy 2-core machine OpenMP spin-waiting
    makes each op up to 100x slower; restore the setting afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def model() -> Transformer:
    return tiny_transformer()
