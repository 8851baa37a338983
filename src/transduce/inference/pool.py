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

import ctypes
import logging
import multiprocessing
import os
import signal
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, replace
from typing import Iterator, Sequence

import torch
from torch import Tensor

from ..errors import CheckpointError, ConfigError, TransduceError
from .batching import length_sorted_batches, spread_batches
from ..config import Runtime
from .placement import ModelDirs, model_dirs
from .search import SearchOutput, SearchSpec
from .translator import BaseTranslator, Translator, load_search_model, shared_tokenizer

logger = logging.getLogger(__name__)

# How TranslatorPool cuts a call's sentences into batches (see TranslatorPool._batches): a few
# batches per worker, so that no worker sits idle at the end (BENCHMARKS.md, "Worker processes").
BATCHES_PER_WORKER = 4
MIN_BATCH_TOKENS = 2048

# How long a worker waits for the others to have loaded the model (SearchPool's start), and
# how often it checks that its parent is still alive.
START_TIMEOUT_S = 300.0
PARENT_POLL_S = 0.5

# A batch not answered within its deadline means a hung worker (SIGSTOP, an endless loop, a
# deadlock): the deadline is the larger of runtime.worker_timeout_s and SLOW_FACTOR times what the batch
# should take at the slowest speed the pool has measured (seconds per searched position), so a
# slow but healthy worker, or a large batch on a big model, is given what it needs once the pool
# has seen a batch of that model.
SLOW_FACTOR = 10.0

# This worker process's Translator, or the error that loading it raised (set once by
# _init_worker, in the worker; the parent's copy stays empty).
_WORKER: dict = {}


@dataclass(frozen=True)
class _Packed:
    """A tensor as plain bytes. Pickled by value: torch's own reductions would share it through
    file descriptors that the sender must still serve when the receiver unpickles, which fails
    (with a traceback in every worker) once a stopping parent has gone."""

    data: bytes
    dtype: torch.dtype
    shape: tuple[int, ...]

    @classmethod
    def of(cls, t: Tensor) -> "_Packed":
        t = t.detach().cpu().contiguous()
        # One C copy of the memory (bytes() of a storage iterates it in Python, element by element).
        return cls(ctypes.string_at(t.data_ptr(), t.numel() * t.element_size()), t.dtype, tuple(t.shape))

    def tensor(self) -> Tensor:
        if not self.data:
            return torch.empty(self.shape, dtype=self.dtype)
        return torch.frombuffer(bytearray(self.data), dtype=self.dtype).view(self.shape)


def _pack(out: SearchOutput) -> tuple[_Packed | None, ...]:
    return tuple(None if t is None else _Packed.of(t)
                 for t in (out.tokens, out.lengths, out.scores, out.log_probs, out.attention))


def _unpack(parts: tuple[_Packed | None, ...]) -> SearchOutput:
    return SearchOutput(*(None if p is None else p.tensor() for p in parts))


def _init_worker(dirs: list[str], draft: str | None, runtime: Runtime, barrier) -> None:
    """Load the model (an ensemble of ``dirs``, a ``draft``) in a fresh worker, prepared as
    ``transduce translate`` prepares it (a CPU :class:`~transduce.inference.Translator` on
    ``runtime``). An error is kept, not raised:
    raised here it would only break the pool ("a child process terminated abruptly"); raised by
    the first task, the parent gets it with its message."""
    # Ctrl-C is the parent's to handle (it stops the pool); a worker would print a traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _WORKER["barrier"] = barrier
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), name="transduce-parent-watch",
                     daemon=True).start()
    try:
        torch.set_num_threads(runtime.worker_threads)
        # No tokenizer: workers only search ids, and a SearchPool needs none in the directory.
        model, speculation = load_search_model(dirs, draft, torch.device("cpu"))
        _WORKER["translator"] = Translator(model, None, replace(runtime, device="cpu", workers=0),
                                           speculation=speculation)
    except TransduceError as err:
        _WORKER["error"] = err
    except Exception as err:  # noqa: BLE001 - any failure to load is reported as one line
        _WORKER["error"] = CheckpointError(f"{dirs[0]}: a decoding worker could not load it: "
                                           f"{type(err).__name__}: {err}")


def _exit_with_parent(parent: int) -> None:
    """End this worker once its parent is gone. A parent killed without closing the pool (kill
    -9, or uvicorn re-raising SIGTERM after its shutdown) never tells its workers, and they would
    wait on the task queue for ever: an orphan per worker, each with a copy of the model."""
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os._exit(0)


def _ready() -> int:
    """SearchPool's start task, one per worker: each waits at the barrier until all have loaded
    the model (so no worker takes two of them, and none loads later); an error is raised."""
    barrier = _WORKER.pop("barrier", None)
    if barrier is not None:
        if "error" in _WORKER:
            barrier.abort()
        else:
            barrier.wait(START_TIMEOUT_S)
    if "error" in _WORKER:
        raise _WORKER["error"]
    return os.getpid()


def _search(src: _Packed, spec: SearchSpec, prefix: _Packed | None = None, constraints: _Packed | None = None
            ) -> tuple[float, tuple[_Packed | None, ...]]:
    """Search one batch in a worker: (seconds it took, the packed SearchOutput)."""
    if "error" in _WORKER:
        raise _WORKER["error"]
    translator = _WORKER["translator"]
    start = time.perf_counter()
    with torch.inference_mode(), translator.autocast():
        out = _pack(spec.run(translator.model, src.tensor(), None if prefix is None else prefix.tensor(),
                             translator.speculation, None if constraints is None else constraints.tensor()))
    return time.perf_counter() - start, out


def _positions(src: Tensor, spec: SearchSpec) -> float:
    """What a search of the (B, S) batch ``src`` costs, in positions searched: sentences x beam x
    the longest output allowed (the measure the pool's deadlines scale with)."""
    beam = 1 if spec.temperature else spec.decode.beam
    return src.shape[0] * beam * (spec.decode.max_len_a * src.shape[1] + spec.decode.max_len_b + 1)


class WorkerLost(TransduceError):
    """Decoding workers died or hung again after a restart: the batch is not answered (a server
    says 503)."""


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
    :meth:`close` stops them; a worker whose parent dies without closing ends by itself. A
    worker that dies (SIGKILL, out of memory) takes the pool down with it (``concurrent.futures``
    breaks the whole pool), and one that stops answering (SIGSTOP, an endless loop) holds its
    batch for ever; either way :meth:`map` kills the old workers, starts a new pool
    (``restarts`` counts them, ``hangs`` those for a hung worker) and resubmits the batches not
    yet answered, once: a batch that breaks or hangs the new pool too raises
    :class:`WorkerLost`. Nothing is lost silently and nothing hangs.
    """

    def __init__(self, paths: ModelDirs, runtime: Runtime = Runtime(workers=2),
                 draft: str | os.PathLike | None = None):
        if runtime.workers < 1:
            raise ConfigError(f"runtime.workers: a pool needs at least one worker; got {runtime.workers}")
        self.workers, self.timeout_s = runtime.workers, runtime.worker_timeout_s
        self.restarts = self.hangs = 0
        self.pids: list[int] = []
        self._rate = 0.0  # the slowest seconds per searched position measured so far
        dirs = [os.fspath(p) for p in ([paths] if isinstance(paths, (str, os.PathLike)) else paths)]
        self._init = (dirs, None if draft is None else os.fspath(draft), runtime)
        self._open()
        logger.info("%d decoding worker(s) ready, %d thread(s) each", self.workers, runtime.worker_threads)

    def _open(self) -> None:
        """Start the worker processes and wait until each has loaded the model."""
        context = multiprocessing.get_context("spawn")
        self._executor = ProcessPoolExecutor(self.workers, mp_context=context, initializer=_init_worker,
                                             initargs=(*self._init, context.Barrier(self.workers)))
        try:
            self._start(self.workers)
        except BaseException:
            self.close()
            raise

    def _processes(self) -> list[multiprocessing.Process]:
        """This pool's live worker processes."""
        return [p for p in multiprocessing.active_children() if p.pid in self.pids]

    def _restart(self, hung: bool = False) -> None:
        """A worker died (killed, out of memory) or hung: kill the old workers, without waiting
        on them, and replace the whole pool with a new one."""
        self.restarts += 1
        self.hangs += hung
        logger.warning("a decoding worker process %s; starting %d new one(s) (restart %d)",
                       f"did not answer within {self.timeout_s:g} s" if hung else "died", self.workers, self.restarts)
        for process in self._processes():
            process.kill()
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._open()

    def _start(self, workers: int) -> None:
        """One start task per worker, submitted at once (each submit finds no idle worker, so
        starts one); the first load error, preferring our own one-line errors, is raised."""
        futures = [self._executor.submit(_ready) for _ in range(workers)]
        errors = [e for e in (f.exception() for f in futures) if e is not None]
        if any(isinstance(e, BrokenProcessPool) for e in errors):
            raise TransduceError("the decoding worker processes did not start (see their errors above); a script "
                                 "that starts them needs the 'if __name__ == \"__main__\":' guard, and cannot be "
                                 "read from standard input")
        if errors:
            raise next((e for e in errors if isinstance(e, TransduceError)), errors[0])
        self.pids = sorted(f.result() for f in futures)

    def _deadline(self, positions: float) -> float:
        """Seconds a batch of ``positions`` may take (see ``SLOW_FACTOR``)."""
        return max(self.timeout_s, SLOW_FACTOR * self._rate * positions)

    def map(self, batches: Sequence[Tensor], spec: SearchSpec, prefixes: Sequence[Tensor | None] | None = None,
            constraints: Sequence[Tensor | None] | None = None) -> Iterator[SearchOutput]:
        """One :class:`SearchOutput` per batch, in order; the batches are searched concurrently
        (each with its forced-prefix ids and its constraint ids, if given)."""
        prefixes = prefixes or [None] * len(batches)
        constraints = constraints or [None] * len(batches)
        jobs = [(_Packed.of(src), spec, None if p is None else _Packed.of(p), None if c is None else _Packed.of(c))
                for src, p, c in zip(batches, prefixes, constraints)]
        deadlines = [self._deadline(_positions(src, spec)) for src in batches]
        try:
            futures = [self._executor.submit(_search, *job) for job in jobs]
        except BrokenProcessPool:  # a worker died between calls
            self._restart()
            futures = [self._executor.submit(_search, *job) for job in jobs]
        retried = -1  # the batch whose search was resubmitted after a worker died or hung
        i, answered = 0, time.monotonic()
        try:
            while i < len(jobs):
                hang, answered = _await(futures[i:], deadlines[i:], answered)
                if hang is None:
                    try:
                        seconds, result = futures[i].result()
                    except BrokenProcessPool:
                        pass
                    else:
                        self._rate = max(self._rate, seconds / _positions(batches[i], spec))
                        yield _unpack(result)
                        i += 1
                        continue
                if retried == i:  # it broke or hung the new workers too: a poison batch, not bad luck
                    if hang is not None:  # the pool must not stay stuck for the next call
                        self._restart(hung=True)
                    raise WorkerLost(f"a decoding worker {hang or 'died'} twice on the same batch") from None
                self._restart(hung=hang is not None)
                retried = i
                futures[i:] = [f if _answered(f) else self._executor.submit(_search, *job)
                               for f, job in zip(futures[i:], jobs[i:])]
                answered = time.monotonic()
        finally:
            for future in futures:
                future.cancel()

    def close(self) -> None:
        """Stop the workers: running searches are given their deadline, then killed."""
        processes = self._processes()
        self._executor.shutdown(wait=False, cancel_futures=True)
        end = time.monotonic() + self.timeout_s
        for process in processes:
            process.join(max(0.0, end - time.monotonic()))
            if process.is_alive():  # hung: it would keep its parent waiting for ever
                process.kill()
                process.join(5.0)

    def __enter__(self) -> "SearchPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _await(futures: list[Future], deadlines: list[float], answered: float) -> tuple[str | None, float]:
    """Wait until ``futures[0]`` is done: (None, when a batch was last answered); or, if none of
    those outstanding is answered within the longest of their deadlines since ``answered``, a
    worker is hung: (why, ``answered``). A busy worker answers within its batch's deadline, so
    the time between two answers never exceeds the longest deadline of the batches outstanding."""
    while not futures[0].done():
        pending = [(f, d) for f, d in zip(futures, deadlines) if not f.done()]
        limit = max(d for _, d in pending)
        done, _ = wait([f for f, _ in pending], timeout=max(0.0, answered + limit - time.monotonic()),
                       return_when=FIRST_COMPLETED)
        if not done:
            return f"did not answer within {limit:g} s", answered
        answered = time.monotonic()
    return None, answered


def _answered(future: Future) -> bool:
    """Whether ``future`` holds a worker's answer (not an error from a broken pool)."""
    return future.done() and not future.cancelled() and future.exception() is None


class TranslatorPool(BaseTranslator):
    """A :class:`~transduce.inference.Translator` whose searches run in worker processes.

    Same methods and results as a Translator on the CPU (``translate``, ``translate_detailed``,
    ``sample``); the batches of each call are spread so that every worker gets some (see
    :func:`~transduce.inference.batching.spread_batches`). Use it in a ``with`` block, or call
    :meth:`close`, to stop the workers.

    Args:
        paths: as :class:`SearchPool` (the parent loads only the configuration, the tokenizer and
            the decoding settings of the first directory).
        runtime: as :class:`SearchPool`.
        draft: as :class:`SearchPool`.
    """

    def __init__(self, paths: ModelDirs, runtime: Runtime = Runtime(workers=2),
                 draft: str | os.PathLike | None = None):
        from ..model.io import load_decode_config, load_model_config

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
                constraints: list[Tensor | None] | None = None) -> Iterator[SearchOutput]:
        return self.pool.map(batches, spec, prefixes, constraints)
