"""The dynamic batcher on its own, with plain functions instead of a model."""

from __future__ import annotations

import threading
import time
from concurrent.futures import CancelledError, ThreadPoolExecutor

import pytest

from transduce.serve.batcher import DynamicBatcher


class Recorder:
    """A batch function that remembers each batch and takes ``delay`` seconds."""

    def __init__(self, delay: float = 0.0, fail_on=None):
        self.batches: list[tuple] = []
        self.delay, self.fail_on = delay, fail_on

    def __call__(self, key, items):
        self.batches.append((key, list(items)))
        time.sleep(self.delay)
        if self.fail_on is not None and self.fail_on in items:
            raise ValueError(f"cannot process {self.fail_on!r}")
        return [f"{key}:{x}" for x in items]


@pytest.fixture
def closing():
    made = []
    yield made.append
    for b in made:
        b.close()


def test_concurrent_jobs_share_batches_and_keep_their_order(closing):
    run = Recorder(delay=0.02)
    b = DynamicBatcher(run, max_cost=1000, wait_ms=30)
    closing(b)
    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(lambda i=i: b.submit("k", [i, i + 100], cost=2).result(5)) for i in range(24)]
        results = [f.result() for f in futures]
    assert results == [[f"k:{i}", f"k:{i + 100}"] for i in range(24)]
    assert b.stats.requests == 24 and b.stats.items == 48
    assert b.stats.max_requests_per_batch > 1
    assert b.stats.batches < 24


def test_different_keys_never_share_a_batch(closing):
    run = Recorder(delay=0.01)
    b = DynamicBatcher(run, max_cost=1000, wait_ms=20)
    closing(b)
    futures = [b.submit(key, [f"{key}{i}"], cost=1) for i in range(12) for key in ("a", "b")]
    assert [f.result(5) for f in futures] == [[f"{k}:{k}{i}"] for i in range(12) for k in ("a", "b")]
    for key, items in run.batches:
        assert all(x.startswith(key) for x in items)
    assert max(len(items) for _, items in run.batches) > 1


def test_token_budget_bounds_batches(closing):
    run = Recorder(delay=0.01)
    b = DynamicBatcher(run, max_cost=10, wait_ms=50)
    closing(b)
    futures = [b.submit("k", [i], cost=4) for i in range(9)]
    [f.result(5) for f in futures]
    assert all(len(items) * 4 <= 10 for _, items in run.batches)
    big = b.submit("k", ["huge"], cost=50)  # over budget on its own: still runs, alone
    assert big.result(5) == ["k:huge"]


def test_a_failing_batch_fails_only_its_jobs(closing):
    run = Recorder(fail_on="bad")
    b = DynamicBatcher(run, max_cost=100, wait_ms=1)
    closing(b)
    with pytest.raises(ValueError, match="cannot process 'bad'"):
        b.submit("k", ["bad"], cost=1).result(5)
    assert b.submit("k", ["good"], cost=1).result(5) == ["k:good"]
    assert b.stats.failed_batches == 1


def test_cancelled_jobs_are_skipped(closing):
    gate = threading.Event()
    run = Recorder()
    b = DynamicBatcher(lambda key, items: (gate.wait(5), run(key, items))[1], max_cost=100, wait_ms=0)
    closing(b)
    first = b.submit("k", ["first"], cost=1)  # occupies the worker until the gate opens
    time.sleep(0.05)
    dropped = b.submit("k", ["dropped"], cost=1)
    assert dropped.cancel()
    kept = b.submit("k", ["kept"], cost=1)
    gate.set()
    assert first.result(5) == ["k:first"] and kept.result(5) == ["k:kept"]
    with pytest.raises(CancelledError):
        dropped.result(0)
    assert all("dropped" not in items for _, items in run.batches)


def test_max_jobs_one_disables_batching(closing):
    b = DynamicBatcher(Recorder(delay=0.01), max_cost=1000, wait_ms=20, max_jobs=1)
    closing(b)
    futures = [b.submit("k", [i], cost=1) for i in range(6)]
    [f.result(5) for f in futures]
    assert b.stats.batches == 6 and b.stats.max_requests_per_batch == 1


def test_full_queue_and_shutdown(closing):
    gate = threading.Event()
    b = DynamicBatcher(lambda key, items: (gate.wait(5), items)[1], max_cost=100, wait_ms=0, max_queued=2)
    b.submit("k", [0], cost=1)
    time.sleep(0.05)  # the worker holds job 0
    waiting = [b.submit("k", [i], cost=1) for i in (1, 2)]
    with pytest.raises(RuntimeError, match="too many queued"):
        b.submit("k", [3], cost=1)
    gate.set()
    assert [w.result(5) for w in waiting] == [[1], [2]]
    b.close()
    with pytest.raises(RuntimeError, match="shut down"):
        b.submit("k", [4], cost=1)
