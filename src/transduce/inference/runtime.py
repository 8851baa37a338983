"""Where and how a model runs (:class:`Runtime`), and the one function that loads model
directories for it (:func:`load`).

Every way in (the CLI, the server, Python) loads through :func:`load`, as CTranslate2's
Translator, Generator and Encoder share one set of runtime arguments: the device, the precision,
int8 weights, worker processes and threads are said once, here; decoding options (beam, length
penalty, ...) are given at call time (``translate(texts, beam=4)``), the model directory's saved
ones being the defaults.

Examples:
    >>> from transduce.inference import Runtime, load
    >>> with load("runs/demo/model", Runtime(workers=2)) as tr:          # doctest: +SKIP
    ...     tr.translate(["The old man sees the dog."], beam=4)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

import torch

from ..config import model_task
from ..device import PRECISIONS
from ..errors import CheckpointError, ConfigError

# A batch not answered within this many seconds (or more, for large batches once the workers'
# speed is measured) counts as a hung worker (see :mod:`~transduce.inference.pool`).
WORKER_TIMEOUT_S = 120.0

# One model directory, or several (an ensemble).
ModelDirs = str | os.PathLike | Sequence[str | os.PathLike]


@dataclass(frozen=True)
class Runtime:
    """Where and how a model runs; checked on creation (one-line errors naming ``runtime.KEY``).

    Attributes:
        device: "cpu", "cuda", "cuda:N" or "auto" (CUDA if available).
        precision: "fp32", or "bf16"/"fp16" autocast (fp16 on CUDA only).
        int8: dynamic int8 quantisation of the linear layers (CPU only).
        workers: decode in this many CPU worker processes, each with its own copy of the model
            and each call's batches spread over them (0: in this process).
        threads: torch threads (per worker with ``workers``, default 1 there; else torch's choice).
        worker_timeout_s: with ``workers``, a batch not answered within this many seconds (more
            for large batches once the workers' speed is measured) counts as a hung worker, which
            is replaced and the batch retried once.
    """

    device: str = "auto"
    precision: str = "fp32"
    int8: bool = False
    workers: int = 0
    threads: int | None = None
    worker_timeout_s: float = WORKER_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ConfigError(f"runtime.precision: must be one of {', '.join(PRECISIONS)}; got {self.precision!r}")
        if self.workers < 0:
            raise ConfigError(f"runtime.workers: must be >= 0; got {self.workers}")
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"runtime.threads: must be >= 1; got {self.threads}")
        if not self.worker_timeout_s > 0:
            raise ConfigError(f"runtime.worker_timeout_s: must be > 0 seconds; got {self.worker_timeout_s:g}")
        if self.workers and self.device not in ("cpu", "auto"):
            raise ConfigError(f"runtime.workers: worker processes decode on the CPU; got device {self.device!r}")
        if self.int8 and self.device not in ("cpu", "auto"):
            raise ConfigError(f"runtime.int8: dynamic int8 quantisation runs on the CPU; got device {self.device!r}")

    @property
    def worker_threads(self) -> int:
        """Torch threads of each worker process."""
        return self.threads or 1


def model_dirs(paths: ModelDirs) -> list[str]:
    """One or several model directories as a list of strings; a one-line error for none, or for
    a directory that does not exist."""
    dirs = [os.fspath(paths)] if isinstance(paths, (str, os.PathLike)) else [os.fspath(p) for p in paths]
    if not dirs:
        raise ConfigError("model_dirs: give at least one model directory")
    for path in dirs:
        if not os.path.isdir(path):
            raise CheckpointError(f"{path}: model directory not found")
    return dirs


def load(paths: ModelDirs, runtime: Runtime = Runtime(), draft: str | os.PathLike | None = None):
    """What the model directories call for, ready to run on ``runtime``.

    A translation model: a :class:`~transduce.inference.Translator`, or with
    ``runtime.workers`` a :class:`~transduce.inference.TranslatorPool`; several directories (of
    one tokenizer) decode as an ensemble; ``draft``, a smaller model directory of the same
    tokenizer, proposes tokens (speculative decoding: greedy, same output). A language model: a
    :class:`~transduce.inference.Generator`; a classifier: a
    :class:`~transduce.inference.Classifier`. Use the result in a ``with`` block (or ``close`` it).
    """
    from ..model.io import load_model_config
    dirs = model_dirs(paths)
    task = model_task(load_model_config(dirs[0]))
    if task == "translation":
        from .pool import TranslatorPool
        from .translator import Translator
        return (TranslatorPool if runtime.workers else Translator).load(dirs, runtime, draft)
    if len(dirs) > 1 or draft is not None:
        raise ConfigError(f"model_dirs: ensembles and draft models are for translation; {dirs[0]} is a "
                          f"train.task {task} model")
    if runtime.workers:
        raise ConfigError(f"runtime.workers: worker processes decode translation models; {dirs[0]} is a "
                          f"train.task {task} model")
    if task == "lm":
        from .generate import Generator
        return Generator.load(dirs[0], runtime)
    if task == "classify":
        from .classify import Classifier
        return Classifier.load(dirs[0], runtime)
    raise ConfigError(f"{dirs[0]}: a train.task mlm model has nothing to run; score it with transduce evaluate")


def apply_threads(runtime: Runtime) -> None:
    """This process's torch threads, when ``runtime`` sets them (and decodes in this process)."""
    if runtime.threads and not runtime.workers:
        torch.set_num_threads(runtime.threads)
