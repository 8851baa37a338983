"""Fixtures for the serving tests: a live server on loopback (the trained model is in
tests/conftest.py)."""

from __future__ import annotations

import pytest

from extra_helpers import need_extra


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_thread):
    yield


@pytest.fixture(scope="module")
def live_server(trained_dir):
    """A real uvicorn server on 127.0.0.1 (free port) with dynamic batching (20 ms window)."""
    need_extra("serve", "fastapi", "uvicorn")
    from server_helpers import BackgroundServer
    from transduce.config import ServeConfig
    from transduce.serve import create_app, load_service

    service = load_service(trained_dir, ServeConfig(batch_wait_ms=20.0, max_sentences=8, max_sentence_chars=200,
                                                   max_body_bytes=8192))
    server = BackgroundServer(create_app(service)).start()
    yield server
    server.stop()
    service.close()
