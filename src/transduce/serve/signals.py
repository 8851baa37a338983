"""Stopping a server: SIGTERM (``kill``, systemd's or a container's stop) ends it as Ctrl-C does."""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While in the block, SIGTERM raises KeyboardInterrupt in the main thread as SIGINT does, so
    a server stopped either way ends the same: its own shutdown first (uvicorn finishes the
    requests in flight, then raises again the signal it caught, which lands here; Triton stops),
    then the caller's (the batcher, the worker pool), and the command exits 0. Without it uvicorn's
    re-raised SIGTERM meets the default handler and kills the process (-15) before either. The
    previous handler is put back after the block; off the main thread nothing is installed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
