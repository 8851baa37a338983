"""Fixtures for the export tests: the session's small trained model, one thread for torch.

``toy_model`` (beside this file) is registered in ``sys.modules`` by path, so the test modules'
``from toy_model import ...`` works under any pytest import mode.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch


def _toy_model_module():
    if "toy_model" not in sys.modules:
        spec = importlib.util.spec_from_file_location("toy_model", Path(__file__).with_name("toy_model.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules["toy_model"] = module
        spec.loader.exec_module(module)
    return sys.modules["toy_model"]


toy_model = _toy_model_module()


@pytest.fixture(scope="session")
def trained_dir(tmp_path_factory):
    """A trained model directory (config.yaml, model.safetensors, tokenizer files)."""
    return toy_model.toy_model_dir(tmp_path_factory)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models gain nothing from threads; on a busy 2-core machine OpenMP spin-waiting
    makes each op much slower. Restore the setting afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
