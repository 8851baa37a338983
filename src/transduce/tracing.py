"""Named scopes for ``transduce profile`` (:mod:`transduce.profiling`): a
``torch.profiler.record_function`` while a profiler records, nothing otherwise.

The time split of a profile (attention, FFN, softmax/loss, data, optimizer) reads these names;
a scope outside a profile costs one flag test, not a profiler call, so the hot loops may hold one.
"""

from __future__ import annotations

import contextlib

import torch

# The scopes' names, as the profile's split reads them.
ATTENTION, FFN, SOFTMAX, LOSS, DATA = "attention", "ffn", "softmax", "loss", "data"


def scope(name: str) -> contextlib.AbstractContextManager:
    """``record_function(name)`` while a profiler records; a no-op context otherwise."""
    if torch.autograd.profiler._is_profiler_enabled:
        return torch.profiler.record_function(name)
    return contextlib.nullcontext()
