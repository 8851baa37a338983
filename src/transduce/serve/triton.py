"""``transduce serve --engine triton``: a real Triton Inference Server on a model directory.

pytriton (the ``triton`` extra) starts the ``tritonserver`` binary it bundles, which runs on a
CPU too, and binds one model, ``translate`` (:mod:`~transduce.inference.backends.triton`), whose requests Triton's
dynamic batcher gathers (``max_queue_delay`` = ``ServeConfig.batch_wait_ms``, preferred batch
sizes up to ``max_sentences``). HTTP (KServe v2) listens on ``ServeConfig.port``, gRPC on
``grpc_port`` (default: the port + 1). Decoding runs in this process, through the one front door
(:func:`~transduce.inference.load`): a Translator, or a pool with ``runtime.workers``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sysconfig
from pathlib import Path
from typing import Any, Iterator

from ..config import ServeConfig
from ..errors import TransduceError, require
from ..interop.triton import preferred_batch_sizes
from ..inference.runtime import ModelDirs, Runtime, load
from ..inference.backends.triton import PARAMETERS, Rows, TritonTranslate
from .signals import sigterm_as_interrupt

logger = logging.getLogger(__name__)
MODEL_NAME = "translate"


def require_triton():
    """pytriton, or a one-line error naming the extra (and numpy < 2, which pytriton 0.7 needs:
    with numpy 2 its Python backend stub dies reading a BYTES tensor)."""
    pytriton = require("pytriton.triton", "triton", "engine triton")
    import numpy as np

    if int(np.__version__.split(".")[0]) >= 2:
        raise TransduceError(f"engine triton: pytriton's Python backend needs numpy < 2 (found {np.__version__}); "
                             "install it with: pip install 'transduce[triton]'")
    return pytriton


def grpc_port(cfg: ServeConfig) -> int:
    """The gRPC port: ``cfg.grpc_port``, else the HTTP port + 1."""
    return cfg.grpc_port if cfg.grpc_port is not None else cfg.port + 1


def infer_function(model: TritonTranslate):
    """pytriton's infer function (one call per batch Triton gathered): list of requests in,
    list of output dicts out."""

    def infer(requests: list[Any]) -> list[dict[str, Any]]:
        rows: list[Rows] = [model.rows(r["text"], dict(r.parameters or {})) for r in requests]
        return model.answer(rows)

    return infer


def bind(triton, model: TritonTranslate, cfg: ServeConfig) -> None:
    """Bind ``translate`` (BYTES in, BYTES/FP32 out, dynamic batching) to a pytriton server."""
    import numpy as np
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor

    delay_us = int(cfg.batch_wait_ms * 1000) if cfg.batching != "none" else 0
    config = ModelConfig(max_batch_size=cfg.max_sentences,
                         batcher=DynamicBatcher(max_queue_delay_microseconds=delay_us,
                                                preferred_batch_size=preferred_batch_sizes(cfg.max_sentences)))
    triton.bind(model_name=MODEL_NAME, infer_func=infer_function(model), config=config, strict=False,
                inputs=[Tensor(name="text", dtype=np.bytes_, shape=(1,))],
                outputs=[Tensor(name="translation", dtype=np.bytes_, shape=(-1,)),
                         Tensor(name="score", dtype=np.float32, shape=(-1,)),
                         Tensor(name="error", dtype=np.bytes_, shape=(1,))])


@contextlib.contextmanager
def own_libpython() -> Iterator[None]:
    """The Python backend's stub embeds a libpython found by the dynamic loader, and runs this
    interpreter's standard library: with the interpreter's own shared libpython first on
    ``LD_LIBRARY_PATH`` the two match (a distribution's older libpython fails in
    ``multiprocessing``). Restores the variable afterwards."""
    before = os.environ.get("LD_LIBRARY_PATH")
    libdir = sysconfig.get_config_var("LIBDIR")
    library = sysconfig.get_config_var("LDLIBRARY") or ""
    if libdir and (Path(libdir) / library).is_file():
        os.environ["LD_LIBRARY_PATH"] = os.pathsep.join([libdir, *([before] if before else [])])
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("LD_LIBRARY_PATH", None)
        else:
            os.environ["LD_LIBRARY_PATH"] = before


def start_triton(model: TritonTranslate, cfg: ServeConfig):
    """A running pytriton server with ``translate`` bound (``stop()`` it); its model is ready."""
    triton_module = require_triton()
    config = triton_module.TritonConfig(http_address=cfg.host, http_port=cfg.port, grpc_address=cfg.host,
                                        grpc_port=grpc_port(cfg), allow_metrics=False, exit_timeout_secs=10)
    triton = triton_module.Triton(config=config)
    try:
        bind(triton, model, cfg)
        with own_libpython():
            triton.run()
    except BaseException:
        triton.stop()
        raise
    return triton


def serve_triton(paths: ModelDirs, cfg: ServeConfig, runtime: Runtime = Runtime(),
                 draft: str | os.PathLike | None = None, defaults: dict[str, Any] | None = None) -> None:
    """Load the model directories (the one front door) and serve them with Triton until SIGINT
    or SIGTERM; then stop the server and the translator."""
    require_triton()
    model = TritonTranslate(load(paths, runtime, draft), defaults, cfg.max_sentence_chars)
    triton = None
    try:
        with sigterm_as_interrupt():
            triton = start_triton(model, cfg)
            logger.info("Triton serving model %r on http://%s:%d (KServe v2) and grpc %s:%d; parameters: %s",
                        MODEL_NAME, cfg.host, cfg.port, cfg.host, grpc_port(cfg), ", ".join(PARAMETERS))
            triton.serve()
    except KeyboardInterrupt:
        logger.info("stopping Triton")
    finally:
        if triton is not None:
            triton.stop()
        model.close()
