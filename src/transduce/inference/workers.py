"""One decoding worker process: its side (load the model, then search batch after batch) and the
parent's handle on it (start it, send it a batch, read its answer, see it die, kill it).

Each worker has a pipe of its own, so the parent sees each one separately: which one holds which
batch, which one died (its process sentinel), which one is past its batch's deadline. That is
what lets :class:`~transduce.inference.SearchPool` replace one failed worker alone, as gunicorn's
arbiter does, while the others keep answering (``concurrent.futures`` breaks the whole pool when
one of its processes dies).

Workers are started with "spawn" (a fresh interpreter: no OpenMP pool or lock inherited from a
parent that already ran threads) and load the model directories themselves, so each holds its
own copy of the weights.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import pickle
import signal
import threading
import time
from dataclasses import dataclass, fields, replace

import torch
from torch import Tensor

from ..config import Runtime
from ..errors import CheckpointError, TransduceError
from .search import SearchOutput, SearchSpec
from .search.forced import ForcedOutput, ForceSpec
from .translator import Translator, load_search_model

logger = logging.getLogger(__name__)

# How often a worker checks that its parent is still alive.
PARENT_POLL_S = 0.5

# What a worker's start takes: (model directories, draft directory or None, runtime).
WorkerInit = tuple[list[str], "str | None", Runtime]


@dataclass(frozen=True)
class TensorBytes:
    """A tensor as plain bytes. Pickled by value: torch's own reductions would share it through
    file descriptors that the sender must still serve when the receiver unpickles, which fails
    (with a traceback in every worker) once a stopping parent has gone."""

    data: bytes
    dtype: torch.dtype
    shape: tuple[int, ...]

    @classmethod
    def of(cls, t: Tensor) -> "TensorBytes":
        t = t.detach().cpu().contiguous()
        # One C copy of the memory (bytes() of a storage iterates it in Python, element by element).
        return cls(ctypes.string_at(t.data_ptr(), t.numel() * t.element_size()), t.dtype, tuple(t.shape))

    def tensor(self) -> Tensor:
        if not self.data:
            return torch.empty(self.shape, dtype=self.dtype)
        return torch.frombuffer(bytearray(self.data), dtype=self.dtype).view(self.shape)


Packed = tuple[type, tuple[TensorBytes | None, ...]]  # an output's class and its tensors (or None) in field order


def pack(out: SearchOutput | ForcedOutput) -> Packed:
    tensors = (getattr(out, f.name) for f in fields(out))
    return type(out), tuple(None if t is None else TensorBytes.of(t) for t in tensors)


def unpack(parts: Packed) -> SearchOutput | ForcedOutput:
    kind, tensors = parts
    return kind(*(None if p is None else p.tensor() for p in tensors))


# ---------------------------------------------------------------------------- the worker's side

def _worker_main(conn, dirs: list[str], draft: str | None, runtime: Runtime) -> None:
    """A worker process: load the model (as ``transduce translate`` prepares it: a CPU
    :class:`~transduce.inference.Translator` on ``runtime``), say ("ready", pid) or ("error",
    the one-line error), then answer (token, src, spec, prefix, constraints) tasks until None or a closed pipe."""
    # Ctrl-C is the parent's to handle (it stops the pool); a worker would print a traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), name="transduce-parent-watch",
                     daemon=True).start()
    try:
        torch.set_num_threads(runtime.worker_threads)
        # No tokenizer: workers only search ids, and a SearchPool needs none in the directory.
        model, speculation = load_search_model(dirs, draft, torch.device("cpu"))
        translator = Translator(model, None, replace(runtime, device="cpu", workers=0), speculation=speculation)
    except TransduceError as err:
        conn.send(("error", err))
        return
    except Exception as err:  # noqa: BLE001 - any failure to load is reported as one line
        conn.send(("error", CheckpointError(f"{dirs[0]}: a decoding worker could not load it: "
                                            f"{type(err).__name__}: {err}")))
        return
    conn.send(("ready", os.getpid()))
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        token, src, spec, prefix, constraints = task
        try:
            conn.send(("done", token, _search(translator, src, spec, prefix, constraints)))
        except Exception as err:  # noqa: BLE001 - a failed search is the caller's error, not the worker's end
            conn.send(("failed", token, _sendable(err)))


def _exit_with_parent(parent: int) -> None:
    """End this worker once its parent is gone. A parent killed without closing the pool (kill
    -9, or uvicorn re-raising SIGTERM after its shutdown) never tells its workers, and they would
    wait for a task for ever: an orphan per worker, each with a copy of the model."""
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os._exit(0)


def _search(translator: Translator, src: TensorBytes, spec: SearchSpec | ForceSpec, prefix: TensorBytes | None,
            constraints: tuple[TensorBytes, TensorBytes | None] | None = None) -> tuple[float, Packed]:
    """Search one batch (with its forced prefixes, and its constraint ids with the table of the
    pieces that continue a word, if any), or force-decode it (``prefix``: the targets): (seconds
    it took, the packed SearchOutput or ForcedOutput)."""
    start = time.perf_counter()
    phrases, inside = (None, None) if constraints is None else constraints
    with torch.inference_mode(), translator.autocast():
        out = pack(spec.run(translator.model, src.tensor(), None if prefix is None else prefix.tensor(),
                            translator.speculation, None if phrases is None else phrases.tensor(),
                            inside=None if inside is None else inside.tensor()))
    return time.perf_counter() - start, out


def _sendable(err: Exception) -> Exception:
    """``err``, or a TransduceError with its message if it cannot cross the pipe."""
    try:
        pickle.loads(pickle.dumps(err))
        return err
    except Exception:  # noqa: BLE001 - any exception that does not round-trip
        return TransduceError(f"{type(err).__name__}: {err}")


# ---------------------------------------------------------------------------- the parent's side

@dataclass
class Task:
    """A batch a worker holds: its ``token`` (answers carry it back), the call that sent it
    (None once that call has ended: the answer is dropped) and the batch's index there, the
    monotonic time by which it must be answered, and the seconds that gave it."""

    token: int
    call: object | None
    index: int
    deadline: float
    seconds: float


class Worker:
    """The parent's handle on one worker process (started, not yet ready, when constructed)."""

    def __init__(self, init: WorkerInit, start_timeout_s: float):
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_worker_main, args=(child, *init), name="transduce-decoder",
                                       daemon=True)
        self.process.start()
        child.close()  # the parent's copy of the child's end: without closing it, no EOF on death
        self.ready = False
        self.task: Task | None = None
        self.start_deadline = time.monotonic() + start_timeout_s

    @property
    def pid(self) -> int:
        return self.process.pid

    def waitables(self) -> list:
        """What becomes ready when this worker says something or dies."""
        return [self.conn, self.process.sentinel]

    def dead(self) -> bool:
        return self.process.exitcode is not None

    def send(self, task: Task, job: tuple) -> bool:
        """Give the worker a batch; False if its pipe is broken (it died)."""
        try:
            self.conn.send((task.token, *job))
        except OSError:
            return False
        self.task = task
        return True

    def receive(self):
        """The worker's next message, or None if it died (its pipe is closed)."""
        try:
            return self.conn.recv() if self.conn.poll() else ()
        except (EOFError, OSError, pickle.UnpicklingError):
            return None

    def kill(self) -> None:
        """End the process (SIGKILL ends a stopped one too) and reap it."""
        if self.process.exitcode is None:
            self.process.kill()
        self.process.join(5.0)
        self.conn.close()

    def stop(self) -> None:
        """Ask the worker to end after the batch it holds."""
        try:
            self.conn.send(None)
        except OSError:
            pass
