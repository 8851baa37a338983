"""Serve a model over HTTP: ``transduce serve MODEL_DIR`` (FastAPI + uvicorn, optional extra), or
with ``--engine triton`` on a Triton Inference Server (:func:`serve_triton`, the ``triton`` extra).

Concurrent requests are gathered into token-budget batches by :class:`DynamicBatcher`; a demo
page at ``/`` translates typed sentences and shows each translation's cross-attention.
"""

from ..config import ServeConfig
from .app import TranslationService, create_app, load_service, serve
from .batcher import BatchStats, DynamicBatcher
from .triton import serve_triton

__all__ = ["ServeConfig", "TranslationService", "create_app", "load_service", "serve", "serve_triton",
           "BatchStats", "DynamicBatcher"]
