"""The one function that loads model directories (:func:`load`) for where and how they run
(:class:`~transduce.config.Runtime`).

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

from ..config import TASKS, Runtime, model_task
from ..errors import ConfigError
from ..model.io import load_model_config
from .classify import Classifier
from .generate import Generator
from .placement import ModelDirs, model_dirs
from .pool import TranslatorPool
from .translator import Translator


def load(paths: ModelDirs, runtime: Runtime = Runtime(), draft: str | os.PathLike | None = None):
    """What the model directories call for, ready to run on ``runtime``.

    A translation model: a :class:`~transduce.inference.Translator`, or with
    ``runtime.workers`` a :class:`~transduce.inference.TranslatorPool`; several directories (of
    one tokenizer) decode as an ensemble; ``draft``, a smaller model directory of the same
    tokenizer, proposes tokens (speculative decoding: greedy, same output). A language model: a
    :class:`~transduce.inference.Generator`; a classifier: a
    :class:`~transduce.inference.Classifier`. Use the result in a ``with`` block (or ``close`` it).
    """
    dirs = model_dirs(paths)
    if runtime.backend != "torch" and (len(dirs) > 1 or draft is not None):
        raise ConfigError(f"runtime.backend: {runtime.backend} runs one model's exported graphs; ensembles and draft "
                          "models run with backend torch")
    task = model_task(load_model_config(dirs[0]))
    door = TASKS[task].front_door
    if TASKS[task].translates:
        return (TranslatorPool if runtime.workers else Translator).load(dirs, runtime, draft)
    if len(dirs) > 1 or draft is not None:
        raise ConfigError(f"model_dirs: ensembles and draft models are for translation; {dirs[0]} is a "
                          f"train.task {task} model")
    if runtime.workers:
        raise ConfigError(f"runtime.workers: worker processes decode translation models; {dirs[0]} is a "
                          f"train.task {task} model")
    if door is None:
        raise ConfigError(f"{dirs[0]}: a train.task {task} model has nothing to run; score it with transduce evaluate")
    return {"Generator": Generator, "Classifier": Classifier}[door].load(dirs[0], runtime)


__all__ = ["ModelDirs", "load", "model_dirs"]
