"""Fixtures for the serving tests: the session's trained toy model and a live server on loopback.

The toy model is trained by tests/export/toy_model.py (loaded by path: test directories are
not packages), so a full test run trains it once for both directories.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch


def _toy_model_module():
    if "toy_model" not in sys.modules:
        path = Path(__file__).resolve().parents[1] / "export" / "toy_model.py"
        spec = importlib.util.spec_from_file_location("toy_model", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules["toy_model"] = module
        spec.loader.exec_module(module)
    return sys.modules["toy_model"]


toy_model = _toy_model_module()


@pytest.fixture(scope="session")
def trained_dir(tmp_path_factory):
    return toy_model.toy_model_dir(tmp_path_factory)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models gain nothing from threads; on a busy 2-core machine OpenMP spin-waiting
    makes each op much slower. Restore the setting afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def live_server(trained_dir):
    """A real uvicorn server on 127.0.0.1 (free port) with dynamic batching (20 ms window)."""
    pytest.importorskip("fastapi", reason="the 'serve' extra (fastapi) is not installed")
    pytest.importorskip("uvicorn", reason="the 'serve' extra (uvicorn) is not installed")
    from transduce.serve import BackgroundServer, ServeConfig, create_app, load_service

    service = load_service(trained_dir, ServeConfig(batch_wait_ms=20.0, max_sentences=8, max_sentence_chars=200,
                                                   max_body_bytes=8192))
    server = BackgroundServer(create_app(service)).start()
    yield server
    server.stop()
    service.close()
