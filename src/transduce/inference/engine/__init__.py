"""Continuous batching for encoder-decoder searches: requests join the running batch at the
next decoding step and leave it when they finish (:class:`ContinuousTranslator`, the front
door; :class:`Scheduler`, the step loop; :class:`RowKVCache`, the cache rows join and leave).

Greedy search, beam search (any beam size, per request) and sampling (a seed per request) run
here; what a shared step does not do runs on :class:`~transduce.inference.Translator`'s
request-level batches (see :meth:`RequestSettings.check` and :func:`unsupported`).
"""

from .cache import RowKVCache, RowLayerCache
from .front import ContinuousTranslator, Handle
from .requests import Request, RequestSettings, Result
from .scheduler import Budget, CancelledRequest, Scheduler, unsupported

__all__ = ["ContinuousTranslator", "Handle", "Scheduler", "Budget", "CancelledRequest", "Request",
           "RequestSettings", "Result", "RowKVCache", "RowLayerCache", "unsupported"]
