"""Fixtures for the export tests: one thread for torch (the trained model is in tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_thread):
    yield
