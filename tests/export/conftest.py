"""Fixtures for the export tests: the session's small trained model, one thread for torch."""

from __future__ import annotations

import pytest
import torch
from toy_model import toy_model_dir


@pytest.fixture(scope="session")
def trained_dir(tmp_path_factory):
    """A trained model directory (config.yaml, model.safetensors, tokenizer files)."""
    return toy_model_dir(tmp_path_factory)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models gain nothing from threads; on a busy 2-core machine OpenMP spin-waiting
    makes each op much slower. Restore the setting afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
