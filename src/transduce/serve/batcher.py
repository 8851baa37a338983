"""Dynamic batching: concurrent requests gathered for a few milliseconds into one batch.

One worker thread owns the model. Requests are queued as jobs; the worker takes the oldest,
then keeps collecting jobs with the same batching key (the same search settings) for up to
``wait_ms`` or until the token budget is full, and runs them as one call. Jobs that do not fit
wait for the next batch, in arrival order. While a batch runs, new jobs queue up, so under load
batches fill without any waiting at all.

The batcher knows nothing about HTTP or models: ``run(key, items)`` does the work, so it can
be tested with a plain function.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Sequence

logger = logging.getLogger(__name__)

# Runs one batch: (key, items of all its jobs, in order) -> one result per item.
RunBatch = Callable[[Hashable, list[Any]], Sequence[Any]]


@dataclass
class Job:
    """Some items that must be processed with the same ``key``; ``future`` gets their results."""

    key: Hashable
    items: list[Any]
    cost: int
    future: Future = field(default_factory=Future)


@dataclass
class BatchStats:
    """Counters the server exposes at /health, so clients (and tests) can see batching work."""

    batches: int = 0
    requests: int = 0
    items: int = 0
    max_requests_per_batch: int = 0
    max_items_per_batch: int = 0
    failed_batches: int = 0

    def record(self, jobs: list[Job]) -> None:
        n_items = sum(len(j.items) for j in jobs)
        self.batches += 1
        self.requests += len(jobs)
        self.items += n_items
        self.max_requests_per_batch = max(self.max_requests_per_batch, len(jobs))
        self.max_items_per_batch = max(self.max_items_per_batch, n_items)


class DynamicBatcher:
    """A worker thread that batches queued jobs and runs them with ``run``.

    Args:
        run: does one batch: ``run(key, items) -> results`` (same length as ``items``).
        max_cost: token budget of a batch (a single larger job still runs, alone).
        wait_ms: how long to wait for more jobs after the first one of a batch.
        max_jobs: at most this many jobs per batch (1 disables batching).
        max_queued: submit() refuses new jobs beyond this many waiting ones.

    Examples:
        >>> b = DynamicBatcher(lambda key, items: [x * 2 for x in items], max_cost=100, wait_ms=1)
        >>> b.submit("double", [1, 2], cost=2).result()
        [2, 4]
        >>> b.close()
    """

    def __init__(self, run: RunBatch, max_cost: int, wait_ms: float = 5.0, max_jobs: int = 256,
                 max_queued: int = 1024):
        self._run = run
        self.max_cost, self.wait_s, self.max_jobs = max_cost, wait_ms / 1000.0, max_jobs
        self.max_queued = max_queued
        self.stats = BatchStats()
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._pending: collections.deque[Job] = collections.deque()  # taken from the queue, not yet run
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="transduce-batcher", daemon=True)
        self._thread.start()

    def submit(self, key: Hashable, items: list[Any], cost: int) -> Future:
        """Queue ``items`` to be run together under ``key``; the future gets their results.

        Raises:
            RuntimeError: the batcher is closed or its queue is full (the caller answers 503).
        """
        if self._closed:
            raise RuntimeError("the batcher is shut down")
        if self.queued() >= self.max_queued:
            raise RuntimeError(f"too many queued requests ({self.max_queued}); try again later")
        job = Job(key, list(items), max(1, cost))
        self._queue.put(job)
        return job.future

    def queued(self) -> int:
        return self._queue.qsize() + len(self._pending)

    def close(self, timeout: float = 5.0) -> None:
        """Stop the worker after the batch in progress; jobs still queued get an error."""
        self._closed = True
        self._queue.put(None)
        self._thread.join(timeout)
        for job in [*self._pending, *_drain(self._queue)]:
            if job is not None and not job.future.done():
                job.future.set_exception(RuntimeError("the server is shutting down"))

    # ---- worker ---------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._closed:
            first = self._pending.popleft() if self._pending else self._queue.get()
            if first is None:
                break
            batch = self._gather(first)
            batch = [j for j in batch if j.future.set_running_or_notify_cancel()]  # drop timed-out jobs
            if batch:
                self._execute(batch)

    def _gather(self, first: Job) -> list[Job]:
        """``first`` plus compatible jobs: pending ones first, then new arrivals until the wait ends."""
        batch, cost = [first], first.cost
        for job in list(self._pending):
            if self._fits(job, first, batch, cost):
                self._pending.remove(job)
                batch.append(job)
                cost += job.cost
        deadline = time.monotonic() + self.wait_s
        while len(batch) < self.max_jobs and cost < self.max_cost:
            try:
                job = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if job is None:  # close(): finish this batch, then stop
                self._closed = True
                break
            if self._fits(job, first, batch, cost):
                batch.append(job)
                cost += job.cost
            else:
                self._pending.append(job)
        return batch

    def _fits(self, job: Job, first: Job, batch: list[Job], cost: int) -> bool:
        return job.key == first.key and len(batch) < self.max_jobs and cost + job.cost <= self.max_cost

    def _execute(self, batch: list[Job]) -> None:
        """Run one batch and hand each job its slice of the results (or the error)."""
        items = [item for job in batch for item in job.items]
        with self._lock:
            self.stats.record(batch)
        try:
            results = list(self._run(batch[0].key, items))
            if len(results) != len(items):
                raise RuntimeError(f"batch function returned {len(results)} results for {len(items)} items")
        except Exception as e:  # noqa: BLE001 - one bad batch must not stop the server
            logger.exception("batch of %d requests failed", len(batch))
            with self._lock:
                self.stats.failed_batches += 1
            for job in batch:
                job.future.set_exception(e)
            return
        start = 0
        for job in batch:
            job.future.set_result(results[start: start + len(job.items)])
            start += len(job.items)


def _drain(q: queue.Queue) -> list[Job | None]:
    out = []
    while True:
        try:
            out.append(q.get_nowait())
        except queue.Empty:
            return out
