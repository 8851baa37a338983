"""Decoding on several CPU cores at once: worker processes, each searching whole batches.

Why processes. A decoding step is a few hundred small tensor ops. PyTorch's intra-op threads
(``torch.set_num_threads``) split each op across cores, which pays for the large matrix products
but not for the small ops; and Python threads in one process take turns on the GIL around every
op, so two of them decoding two batches serialise (BENCHMARKS.md, "Decoding speed"). Worker
processes of one thread each, every one searching batches of its own, do what CTranslate2's
``inter_threads`` do in C++.

The parent keeps the text side (tokenizer, batching, detokenizing, input order); a worker only
holds the model and runs a :class:`~transduce.inference.translator.SearchSpec` on (B, S)
batches of ids. Workers are started with "spawn" (a fresh interpreter: no OpenMP pool or lock
inherited from a parent that already ran threads) and load the model directory themselves, so
each holds its own copy of the weights.

Examples:
    >>> with TranslatorPool.load("runs/base/model", workers=2) as pool:   # doctest: +SKIP
    ...     pool.translate(["A dog runs.", ""], beam=4)
    ['Ein Hund läuft.', '']
"""

from __future__ import annotations

import collections
import itertools
import threading
import logging
import os
import time
from dataclasses import dataclass, field, replace
from multiprocessing.connection import wait
from typing import Iterator, Sequence

from torch import Tensor

from ..errors import ConfigError, TransduceError
from ..model.io import load_decode_config, load_model_config
from .decode_batches import length_sorted_batches, spread_batches
from ..config import DecodeConfig, Runtime
from .placement import ModelDirs, model_dirs
from .search import AttentionChoice, SearchOutput, SearchSpec
from .search.forced import ForcedOutput, ForceSpec
from .translator import BaseTranslator, shared_tokenizer
from .workers import Task, Worker, TensorBytes, unpack

logger = logging.getLogger(__name__)

# How TranslatorPool cuts a call's sentences into batches (see TranslatorPool._batches): a few
# batches per worker, so that no worker sits idle at the end (BENCHMARKS.md, "Worker processes").
BATCHES_PER_WORKER = 4
MIN_BATCH_TOKENS = 2048

# How long a worker may take to load the model before it counts as failed.
START_TIMEOUT_S = 300.0

# A batch not answered within its deadline means a hung worker (SIGSTOP, an endless loop, a
# deadlock): the deadline is the larger of runtime.worker_timeout_s and SLOW_FACTOR times what the batch
# should take at the slowest speed the pool has measured for batches of its size (``Speeds``), so a
# slow but healthy worker, or a large batch on a big model, is given what it needs once the pool
# has seen a batch of that model.
SLOW_FACTOR = 10.0

# A worker that keeps dying is restarted after a growing pause (as gunicorn's arbiter and
# systemd's restart limits do): none after its first death, then BACKOFF_S doubled at each death
# in a row (no batch answered in between), at most BACKOFF_MAX_S; a slot whose worker dies
# MAX_FAILED_STARTS times in a row before it has loaded the model is given up (a model that
# crashes on load is an error to report, not a reason to spin).
BACKOFF_S = 0.5
BACKOFF_MAX_S = 30.0
MAX_FAILED_STARTS = 3

# How many events (worker started, ready, answered, died, hung, ...) the pool keeps.
EVENTS_KEPT = 1000


def _positions(src: Tensor, spec: SearchSpec) -> float:
    """What a search of the (B, S) batch ``src`` costs, in positions searched: sentences x beam x
    the longest output allowed (the measure the pool's deadlines scale with)."""
    beam = 1 if spec.temperature else spec.decode.beam
    return src.shape[0] * beam * (spec.decode.max_len_a * src.shape[1] + spec.decode.max_len_b + 1)


class Speeds:
    """The slowest speed measured (seconds per searched position, see :func:`_positions`) for
    batches of each size, sizes grouped by powers of two.

    A batch's time is a fixed cost (encoder call, Python per step) plus its positions' cost, so
    a small batch's seconds per position are higher than a large one's: one slowest rate for
    all sizes made the deadline of a large batch many times its healthy time (on a loaded
    2-core machine, minutes: a hung worker then stalled the server for minutes, bench/soak.py).
    A batch is judged by batches from half its size up (their rate is at most about its own);
    until one is measured, by the largest smaller ones.
    """

    def __init__(self) -> None:
        self.slowest: dict[int, float] = {}  # log2 size class -> slowest seconds per position

    @staticmethod
    def size_class(positions: float) -> int:
        return max(0, int(positions).bit_length() - 1)

    def record(self, positions: float, seconds: float) -> None:
        k = self.size_class(positions)
        self.slowest[k] = max(self.slowest.get(k, 0.0), seconds / max(positions, 1.0))

    def rate(self, positions: float) -> float:
        """Seconds per position to expect of a batch of ``positions`` (0 before any measure)."""
        k = self.size_class(positions)
        alike = [r for c, r in self.slowest.items() if c >= k - 1]
        if alike:
            return max(alike)
        return self.slowest[max(self.slowest)] if self.slowest else 0.0


class WorkerLost(TransduceError):
    """A batch killed or hung two workers in turn, or no decoding worker is left: the batch is
    not answered (a server says 503)."""


@dataclass
class _Slot:
    """One of the pool's ``workers`` places: its worker (None while it waits out its backoff, or
    for good once given up), deaths in a row, and when it may be restarted."""

    worker: Worker | None
    deaths: int = 0
    failed_starts: int = 0
    restart_at: float = 0.0
    given_up: str | TransduceError = ""


@dataclass
class _Call:
    """One :meth:`SearchPool.map` call: its jobs, their deadlines (seconds), the batches waiting
    for a worker, how often each was lost with its worker, and the answers not yet yielded."""

    jobs: list[tuple]
    deadlines: list[float]
    positions: list[float]
    pending: collections.deque = field(default_factory=collections.deque)
    losses: list[int] = field(default_factory=list)
    answers: dict[int, tuple] = field(default_factory=dict)
    error: BaseException | None = None  # a search's own error, or WorkerLost: raised by map

class SearchPool:
    """Worker processes with a copy of a model each, searching batches of source ids.

    Args:
        paths: a model directory (``config.yaml`` + ``model.safetensors``), or several (an ensemble).
        runtime: ``workers`` processes (one per core is the usual choice) of ``worker_threads``
            torch threads each, with ``precision`` (fp32, or bf16 CPU autocast) and ``int8``;
            ``worker_timeout_s``: the least time a batch may take before its worker counts as
            hung (a batch's deadline grows with its size once the pool has measured its speed).
        draft: a draft model directory (speculative decoding in every worker).

    The workers are started and have loaded the model when the constructor returns (a model
    that cannot be loaded raises its one-line error here); ``pids`` are their process ids.
    :meth:`close` stops them; a worker whose parent dies without closing ends by itself.

    Each worker is supervised alone, as gunicorn's arbiter supervises its workers: one that dies
    (SIGKILL, out of memory) or holds a batch past its deadline (SIGSTOP, an endless loop) is
    killed and replaced by a new process, which loads the model while the others keep
    answering; the batch it held goes to the next free worker. ``restarts`` counts replaced
    workers, ``hangs`` those replaced for a hung one, ``events`` keeps the latest (time, what,
    pid) for tests and monitoring. A batch that kills or hangs a second worker raises
    :class:`WorkerLost` (a poison batch, not bad luck); a worker that dies again and again is
    restarted after a growing pause, and one that cannot load the model is given up with its
    error. Nothing is lost silently and nothing hangs.
    """

    def __init__(self, paths: ModelDirs, runtime: Runtime = Runtime(workers=2),
                 draft: str | os.PathLike | None = None):
        if runtime.workers < 1:
            raise ConfigError(f"runtime.workers: a pool needs at least one worker; got {runtime.workers}")
        self.workers, self.timeout_s = runtime.workers, runtime.worker_timeout_s
        self.restarts = self.hangs = 0
        self.events: collections.deque[tuple[float, str, int]] = collections.deque(maxlen=EVENTS_KEPT)
        self.speeds = Speeds()  # the slowest seconds per searched position measured, by batch size
        self._tokens = itertools.count()
        self._started = False  # every first worker has loaded the model
        self._lock = threading.Lock()  # map's thread and refresh's
        dirs = [os.fspath(p) for p in ([paths] if isinstance(paths, (str, os.PathLike)) else paths)]
        self._init = (dirs, None if draft is None else os.fspath(draft), runtime)
        self._slots = [_Slot(self._spawn()) for _ in range(self.workers)]
        try:
            self._await_start()
        except BaseException:
            self.close()
            raise
        logger.info("%d decoding worker(s) ready, %d thread(s) each", self.workers, runtime.worker_threads)

    @property
    def pids(self) -> list[int]:
        """The process ids of the workers that have loaded the model."""
        return sorted(s.worker.pid for s in self._slots if s.worker is not None and s.worker.ready)

    def _spawn(self) -> Worker:
        worker = Worker(self._init, START_TIMEOUT_S)
        self._event("started", worker.pid)
        return worker

    def _event(self, what: str, pid: int) -> None:
        self.events.append((time.monotonic(), what, pid))

    def _await_start(self) -> None:
        """Wait until every worker has loaded the model; the first failure is raised."""
        while True:
            failed = next((s.given_up for s in self._slots if s.given_up), "")
            if failed:
                raise failed if isinstance(failed, TransduceError) else TransduceError(failed)
            if all(s.worker.ready for s in self._slots):
                self._started = True
                return
            self._serve(None)

    def _deadline(self, positions: float) -> float:
        """Seconds a batch of ``positions`` may take (see ``SLOW_FACTOR``)."""
        return max(self.timeout_s, SLOW_FACTOR * self.speeds.rate(positions) * positions)

    def map(self, batches: Sequence[Tensor], spec: SearchSpec | ForceSpec,
            prefixes: Sequence[Tensor | None] | None = None,
            constraints: Sequence[Tensor | None] | None = None,
            inside: Tensor | None = None) -> Iterator[SearchOutput | ForcedOutput]:
        """One :class:`SearchOutput` per batch, in order; the batches are searched concurrently
        (each with its forced-prefix ids and its constraint ids, if given, whole words with
        ``inside``: :meth:`~transduce.inference.search.SearchSpec.run`). With a
        :class:`ForceSpec` the prefixes are the targets, and each answer a :class:`ForcedOutput`."""
        prefixes = prefixes or [None] * len(batches)
        constraints = constraints or [None] * len(batches)
        positions = [_positions(src, spec) for src in batches]
        words = None if inside is None else TensorBytes.of(inside)
        jobs = [(TensorBytes.of(src), spec, None if p is None else TensorBytes.of(p),
                 None if c is None else (TensorBytes.of(c), words))
                for src, p, c in zip(batches, prefixes, constraints)]
        call = _Call(jobs, [self._deadline(n) for n in positions], positions)
        call.pending.extend(range(len(batches)))
        call.losses = [0] * len(batches)
        try:
            for i in range(len(batches)):
                while i not in call.answers:
                    if call.error is not None:
                        raise call.error
                    self._serve(call)
                yield unpack(call.answers.pop(i))
        finally:  # answers still due to this call are dropped when they come
            with self._lock:
                for slot in self._slots:
                    if slot.worker is not None and slot.worker.task is not None and slot.worker.task.call is call:
                        slot.worker.task.call = None

    def refresh(self) -> None:
        """Take note of what the workers said or did since the last call (a replacement has
        loaded the model, a worker died), without waiting: ``pids`` and the counters are
        current after it (the server's /health calls it)."""
        self._serve(None, block=False)

    def _serve(self, call: _Call | None, block: bool = True) -> None:
        """One round of supervision: restart slots whose pause is over, give free workers the
        batches waiting, wait for a message, a death or a deadline, and act on what happened.
        The lock is not held while waiting, so :meth:`refresh` can run meanwhile; an answer is
        put in the call that sent its batch, whichever thread reads it."""
        with self._lock:
            now = time.monotonic()
            for slot in self._slots:
                if slot.worker is None and not slot.given_up and now >= slot.restart_at:
                    slot.worker = self._spawn()
            if all(s.given_up for s in self._slots):
                if call is None:
                    return
                raise WorkerLost("no decoding worker is left: " + "; ".join(str(s.given_up) for s in self._slots))
            live = [s.worker for s in self._slots if s.worker is not None]
            if call is not None:
                self._dispatch(call, live)
            timeout = self._next_timeout(now)
        waitables = [w for worker in live for w in worker.waitables()]
        if block and waitables:
            wait(waitables, timeout)
        elif block:  # every worker waits out its pause before a restart
            time.sleep(timeout)
        with self._lock:
            for slot in self._slots:
                if slot.worker is not None and slot.worker in live:
                    self._check(slot)

    def _dispatch(self, call: _Call, live: list[Worker]) -> None:
        for worker in live:
            if call.pending and worker.ready and worker.task is None and not worker.dead():
                index = call.pending.popleft()
                seconds = call.deadlines[index]
                task = Task(next(self._tokens), call, index, time.monotonic() + seconds, seconds)
                if not worker.send(task, call.jobs[index]):
                    call.pending.appendleft(index)

    def _next_timeout(self, now: float) -> float:
        """Seconds until the nearest deadline (a batch's, a start's, a restart's)."""
        times = [s.restart_at for s in self._slots if s.worker is None and not s.given_up]
        for s in self._slots:
            if s.worker is not None:
                times.append(s.worker.task.deadline if s.worker.task else
                             s.worker.start_deadline if not s.worker.ready else now + 60.0)
        return max(0.0, min(times, default=now + 60.0) - now)

    def _check(self, slot: _Slot) -> None:
        """Read what ``slot``'s worker said; replace it if it died or is past a deadline."""
        worker = slot.worker
        while slot.worker is worker:
            message = worker.receive()
            if message == ():
                break
            if message is None:  # its pipe is closed: it died
                return self._lose(slot, f"died (exit code {worker.process.exitcode})", hung=False)
            self._handle(slot, message)
        now = time.monotonic()
        if slot.worker is not worker:
            return None
        if worker.dead():
            return self._lose(slot, f"died (exit code {worker.process.exitcode})", hung=False)
        if worker.task is not None and now > worker.task.deadline:
            return self._lose(slot, f"did not answer within {worker.task.seconds:.3g} s", hung=True)
        if not worker.ready and now > worker.start_deadline:
            return self._lose(slot, f"did not load the model within {START_TIMEOUT_S:g} s", hung=True)
        return None

    def _handle(self, slot: _Slot, message: tuple) -> None:
        worker, kind = slot.worker, message[0]
        if kind == "ready":
            worker.ready, slot.failed_starts = True, 0
            self._event("ready", worker.pid)
        elif kind == "error":  # the model cannot be loaded: no restart would help
            slot.given_up = message[1]
            logger.error("a decoding worker could not load the model: %s", message[1])
            worker.kill()
            slot.worker = None
        elif worker.task is not None and message[1] == worker.task.token:
            call, index, worker.task = worker.task.call, worker.task.index, None
            if kind == "failed":
                if call is not None:
                    call.error = message[2]
                return
            slot.deaths = 0
            self._event("answered", worker.pid)
            if call is not None:
                seconds, result = message[2]
                self.speeds.record(call.positions[index], seconds)
                call.answers[index] = result

    def _lose(self, slot: _Slot, why: str, hung: bool) -> None:
        """Kill ``slot``'s worker, give its batch to another, and restart it (after a pause if it
        keeps dying); a batch lost with a second worker raises WorkerLost."""
        worker, self.restarts, self.hangs = slot.worker, self.restarts + 1, self.hangs + hung
        worker.kill()
        slot.worker = None
        self._event("hung" if hung else "died", worker.pid)
        slot.deaths += 1
        slot.failed_starts += not worker.ready
        if not worker.ready and (not self._started or slot.failed_starts >= MAX_FAILED_STARTS):
            slot.given_up = (f"a decoding worker {why} while loading {self._init[0][0]}"
                             + (f", {slot.failed_starts} times in a row; not restarted" if self._started else
                                " (a script that starts workers needs the 'if __name__ == \"__main__\":' guard, "
                                "and cannot be read from standard input)"))
            logger.error("%s", slot.given_up)
            return
        pause = 0.0 if slot.deaths < 2 else min(BACKOFF_MAX_S, BACKOFF_S * 2 ** (slot.deaths - 2))
        slot.restart_at = time.monotonic() + pause
        logger.warning("decoding worker %d %s; starting a new one in %g s (restart %d)", worker.pid, why, pause,
                       self.restarts)
        call = None if worker.task is None else worker.task.call
        if call is not None:
            index = worker.task.index
            call.losses[index] += 1
            if call.losses[index] >= 2:  # it broke or hung a second worker: a poison batch, not bad luck
                call.error = WorkerLost(f"a decoding worker {why} twice on the same batch")
            else:
                call.pending.appendleft(index)

    def close(self) -> None:
        """Stop the workers: running searches are given their deadline, then killed."""
        workers = [s.worker for s in self._slots if s.worker is not None]
        for worker in workers:
            worker.stop()
        end = time.monotonic() + self.timeout_s
        for worker in workers:
            worker.process.join(max(0.0, end - time.monotonic()))
            worker.kill()  # hung: it would keep its parent waiting for ever

    def __enter__(self) -> "SearchPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class TranslatorPool(BaseTranslator):
    """A :class:`~transduce.inference.Translator` whose searches run in worker processes.

    Same methods and results as a Translator on the CPU (``translate``, ``translate_detailed``,
    ``sample``); the batches of each call are spread so that every worker gets some (see
    :func:`~transduce.inference.decode_batches.spread_batches`). Use it in a ``with`` block, or call
    :meth:`close`, to stop the workers.

    Args:
        paths: as :class:`SearchPool` (the parent loads only the configuration, the tokenizer and
            the decoding settings of the first directory).
        runtime: as :class:`SearchPool`.
        draft: as :class:`SearchPool`.
    """

    def __init__(self, paths: ModelDirs, runtime: Runtime = Runtime(workers=2),
                 draft: str | os.PathLike | None = None):
        dirs = model_dirs(paths)
        self.config = load_model_config(dirs[0])  # a bad config fails here
        self.tokenizer = shared_tokenizer(dirs, draft)
        self.decode = load_decode_config(dirs[0])
        if draft is not None:  # speculative decoding is greedy search (or sampling)
            self.decode = replace(self.decode, beam=1, nbest=1)
        self.runtime = runtime
        self.pool = SearchPool(dirs, runtime, draft)

    @classmethod
    def load(cls, paths: ModelDirs, runtime: Runtime = Runtime(workers=2),
             draft: str | os.PathLike | None = None) -> "TranslatorPool":
        """The same as the constructor; named like :meth:`Translator.load`."""
        return cls(paths, runtime, draft)

    def close(self) -> None:
        self.pool.close()

    def _batches(self, lengths: list[int], batch_tokens: int) -> list[list[int]]:
        """Length-sorted batches, smaller than ``batch_tokens`` when that gives every worker about
        ``BATCHES_PER_WORKER`` of them (longest first, so the short ones even out the end), but
        not under ``MIN_BATCH_TOKENS``; then split until every worker has at least one."""
        share = -(-sum(lengths) // (BATCHES_PER_WORKER * self.pool.workers))
        budget = min(batch_tokens, max(share, MIN_BATCH_TOKENS))
        return spread_batches(length_sorted_batches(lengths, budget), lengths, self.pool.workers)

    def _search(self, batches: list[Tensor], spec: SearchSpec, prefixes: list[Tensor | None] | None = None,
                constraints: list[Tensor | None] | None = None, inside: Tensor | None = None) -> Iterator[SearchOutput]:
        return self.pool.map(batches, spec, prefixes, constraints, inside)

    def _force(self, src: Tensor, tgt: Tensor, decode: DecodeConfig, attention: AttentionChoice | None = None
               ) -> ForcedOutput:
        """Forced decoding of one batch in a worker (scores, alignments, markup of a pool's output)."""
        return next(iter(self.pool.map([src], ForceSpec(decode, attention), [tgt])))
