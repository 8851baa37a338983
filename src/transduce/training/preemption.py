"""Preemption: a SIGTERM (a cluster scheduler taking the machine back, ``kill``, systemd's stop)
ends training at the next step boundary with a checkpoint, and the process exits 0; ``transduce
train --resume`` then continues as if never stopped (the checkpoint holds the data order, the RNG
and the optimizer, as every checkpoint does).

The handler only sets a flag: a step is never cut in half, so the time from the signal to the
exit is one step and one checkpoint write.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator

PREEMPTED = "preempted (SIGTERM)"


@contextmanager
def sigterm_flag(enabled: bool = True) -> Iterator[threading.Event]:
    """An event set when SIGTERM arrives, while in the block (the previous handler is put back
    after it). Not installed off the main thread (Python only delivers signals there) or when
    ``enabled`` is False: the event then stays clear."""
    flag = threading.Event()
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield flag
        return
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: flag.set())
    try:
        yield flag
    finally:
        signal.signal(signal.SIGTERM, previous)
