"""Where a loaded model runs: the model directories to load (:func:`model_dirs`), the model a
directory holds as every front door runs it (:func:`load_model_dir`), the model prepared for
decoding on its device (:func:`prepared_for`) and the process's threads (:func:`apply_threads`),
as a :class:`~transduce.config.Runtime` says. The front doors
(Translator, TranslatorPool, Generator, Classifier) use these; :func:`~transduce.inference.load`
picks among the front doors.
"""

from __future__ import annotations

import os
from typing import Sequence

import torch

from ..config import Runtime
from ..device import PRECISIONS
from ..errors import CheckpointError, ConfigError
from ..model.io import load_model
from ..model.transformer import Transformer
from .backends.onnx import open_graphs
from .speed import compile_step, prepare_for_decoding
from .speed.static_int8 import apply_saved, is_quantized

# One model directory, or several (an ensemble).
ModelDirs = str | os.PathLike | Sequence[str | os.PathLike]


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


def load_model_dir(directory: str | os.PathLike, device: torch.device | str = "cpu") -> torch.nn.Module:
    """The model of a model directory as ``translate`` runs it, on ``device``: its float weights, in
    static int8 when the directory was quantised (``transduce quantize`` left ``quant.safetensors``
    beside them, :func:`~transduce.inference.speed.static_int8.apply_saved`). Every loader of a model to
    run (the front doors, workers, held-out scores) goes through here, so they all see one model."""
    return apply_saved(load_model(directory, device), directory)


def prepared_for(model: torch.nn.Module, device: torch.device, runtime: Runtime) -> torch.nn.Module:
    """``model`` on ``device`` in eval mode, prepared for decoding as ``runtime`` says
    (:func:`~transduce.inference.speed.prepare_for_decoding`): int8, or weights kept in the
    autocast dtype for bf16/fp16, or on the CPU oneDNN linear layers; with ``runtime.compile`` on the
    CPU, also the mark that its searches compile their step
    (:func:`~transduce.inference.speed.compile_step`). With ``runtime.backend`` onnx or tensorrt, the
    exported graphs of ``runtime.engines`` in its place (:func:`~.backends.onnx.open_graphs`)."""
    if runtime.backend != "torch":
        return open_graphs(model.config, device, runtime)
    compiled = runtime.compile and device.type == "cpu"
    if compiled:
        check_compilable(model)
    model = prepare_for_decoding(model.to(device).eval(), onednn=device.type == "cpu",
                                 int8=runtime.int8, cast=PRECISIONS[runtime.precision])
    return compile_step(model) if compiled else model


def check_compilable(model: torch.nn.Module) -> None:
    """A one-line error unless ``runtime.compile`` can compile ``model``'s decoding step: one float
    translation Transformer, on a machine with a C++ compiler for Inductor's CPU kernels."""
    import shutil

    if not isinstance(model, Transformer) or not model.config.family.translates:
        raise ConfigError(f"runtime.compile: compiles the decoding step of one translation model; got "
                          f"{type(model).__name__}; drop compile")
    if any(is_quantized(m) for m in model.modules()):
        raise ConfigError("runtime.compile: compiles float models; this one is static int8 (quant.safetensors)")
    compiler = os.environ.get("CXX") or "g++"
    if shutil.which(compiler) is None and shutil.which("clang++") is None:
        raise ConfigError(f"runtime.compile: torch.compile's CPU kernels need a C++ compiler; {compiler} not found "
                          "(install g++ or set CXX), or drop compile")


def apply_threads(runtime: Runtime) -> None:
    """This process's torch threads, when ``runtime`` sets them (and decodes in this process)."""
    if runtime.threads and not runtime.workers:
        torch.set_num_threads(runtime.threads)
