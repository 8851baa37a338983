"""Fixtures shared across test directories (the directories are not packages)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch


def _helper_module(name: str, directory: str):
    """tests/DIRECTORY/NAME.py, registered in ``sys.modules`` by path so ``from NAME import ...``
    works under any pytest import mode and from any test directory."""
    if name not in sys.modules:
        path = Path(__file__).resolve().parent / directory / f"{name}.py"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def pytest_configure(config):
    """``TRANSDUCE_TEST_MKLDNN=0``: run without oneDNN kernels, as on a machine without them
    (CONTRIBUTING.md, "Tests that hold on any CPU")."""
    if os.environ.get("TRANSDUCE_TEST_MKLDNN") == "0":
        torch.backends.mkldnn.enabled = False


extra_helpers = _helper_module("extra_helpers", ".")
toy_model = _helper_module("toy_model", ".")
inference_helpers = _helper_module("inference_helpers", "inference")


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    """A tiny untrained model directory with a trained tokenizer (inference and CLI tests)."""
    from transduce.data.tokenizer import Tokenizer
    from transduce.model import save_model

    root = tmp_path_factory.mktemp("model")
    sentences = inference_helpers.SENTENCES
    tok = Tokenizer.train(sentences * 3, [s.upper() for s in sentences] * 3, root, vocab_size=60)
    save_model(inference_helpers.tiny_transformer(vocab=tok.src_vocab_size, seed=1), root)
    return root


@pytest.fixture(scope="session")
def trained_dir(tmp_path_factory):
    """A small trained model directory (config.yaml, model.safetensors, tokenizer files),
    trained once per session and shared by every test that needs a trained model."""
    return toy_model.toy_model_dir(tmp_path_factory)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models gain nothing from threads; on a busy 2-core machine OpenMP spin-waiting
    makes each op much slower. Restores the setting afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def multi30k_root() -> Path:
    """Multi30k's raw files: $TRANSDUCE_MULTI30K, else ../shared/data/multi30k beside the
    repository (never copied into it); the test is skipped where neither exists."""
    from extra_helpers import multi30k_dir
    root = multi30k_dir()
    if not (root / "train.en.gz").is_file():
        pytest.skip(f"Multi30k not found at {root} (set TRANSDUCE_MULTI30K to its directory)")
    return root
