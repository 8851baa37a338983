"""Decoding speed-ups, applied to a model by :func:`prepare_for_decoding` and undone by :func:`restore`.

The model in :mod:`transduce.model` is the paper's, written to be read. Search runs the same
math faster by switching, in place, the classes of some of its modules (parameters, names and
the state dict stay as they are):

* :class:`~.fast_layers.FastAttention`: Q/K/V (or K/V) projections as one matmul, the fused weights kept
  between calls; keys/values shared by the beams of one sentence (:func:`~.fast_layers.fast_attention`); a
  few queries per row attended as two batched matmuls on CPU, where that beats the fused kernel.
* :class:`~.fast_layers.FastFeedForward`: the ReLU applied inside a oneDNN matmul.
* ``nn.Linear`` -> :class:`~transduce.inference.speed.cpu.OneDNNLinear` on CPU; or dynamic int8;
  or :class:`~.cast.CastLinear`, which under autocast reads low-precision copies of its weights
  kept between calls (for the static search's CUDA graphs).

A search (:func:`prepared`) prepares a plain model for its own duration; a
:class:`~transduce.inference.Translator` prepares its model once and restores it on ``close``.
The eager searches' cache is :class:`~.cache.PooledKVCache` (:func:`new_cache`), the static
search's :class:`~.cache.StaticKVCache`. The copies of the weights kept here (fused
projections, casts) change in place when the weights do, and :func:`refresh` brings them up to
date before a CUDA graph that reads them by address is replayed.

Legend: B query rows, Bk = B / g key/value rows, H heads, Tq/Tk query/key length, Dh head dim.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import nn

from ...errors import ConfigError
from ...model.attention import KVCache, MultiHeadAttention
from ...model.layers import FeedForward
from .fast_layers import FastAttention, FastFeedForward
from .cache import PooledKVCache
from .cast import CastLinear
from .cpu import OneDNNLinear, onednn_available, plain_linears, quantize_dynamic_int8
from .static_int8 import StaticInt8Attention, is_quantized

_FAST = {MultiHeadAttention: FastAttention, StaticInt8Attention: FastAttention, FeedForward: FastFeedForward}
_PLAIN = {FastAttention: MultiHeadAttention, FastFeedForward: FeedForward}


def prepare_for_decoding(model: nn.Module, onednn: bool = False, int8: bool = False,
                         cast: torch.dtype | None = None) -> nn.Module:
    """Switch ``model``'s modules to their decoding versions, in place; returns ``model``.

    Args:
        onednn: also run plain ``nn.Linear`` layers through oneDNN (CPU float32; same math,
            ``F.linear`` whenever gradients or autocast are on; a no-op without oneDNN).
        int8: quantise the linear layers to dynamic int8 first (CPU; see
            :func:`~transduce.inference.cpu.quantize_dynamic_int8`). Not undone by :func:`restore`.
        cast: the autocast dtype the model decodes in (bf16, fp16): plain ``nn.Linear`` layers
            become :class:`~.cast.CastLinear`, which keep their weights in it between calls
            (instead of oneDNN's; ignored with ``int8``).
    """
    if int8:
        if any(is_quantized(m) for m in model.modules()):
            raise ConfigError("runtime.int8: this model is already static int8 (quant.safetensors); "
                              "dynamic int8 is for float models")
        quantize_dynamic_int8(model, inplace=True)
    switch_linears = onednn and not int8 and onednn_available()
    for module in model.modules():
        if type(module) in _FAST:
            module.__class__ = _FAST[type(module)]
        elif cast is not None and not int8 and type(module) is nn.Linear:
            module.__class__ = CastLinear
            module.cast_dtype = cast
        elif switch_linears and type(module) is nn.Linear:
            module.__class__ = OneDNNLinear
    return model


def refresh(model: nn.Module) -> None:
    """Bring every copy of the weights kept by ``model``'s prepared modules (fused projections,
    autocast casts) up to date with its parameters, in place, so that a CUDA graph that reads
    them by address computes with the weights as they are now (e.g. after an optimizer step).
    Run eagerly, before a replay."""
    for module in model.modules():
        if isinstance(module, (FastAttention, CastLinear)):
            module.refresh()


# Where :mod:`~transduce.inference.search.static_shapes` keeps a model's captured searches (and their memory).
STATIC_SEARCHES = "_static_searches"
# The mark of a model whose CPU greedy searches run the static search with a compiled step
# (``runtime.compile``).
COMPILED_STEP = "_compiled_step"


def compile_step(model: nn.Module) -> nn.Module:
    """Mark ``model`` (prepared for decoding; its oneDNN linear layers run ``F.linear`` in a traced
    step, the packed-weight op does not trace) so that its CPU greedy searches (and beam searches
    asked for ``static=True``) run the static search with its step compiled
    (:mod:`~transduce.inference.search.static_shapes`); :func:`restore` takes the mark off."""
    model.__dict__[COMPILED_STEP] = True
    return model


def compiles_step(model: nn.Module) -> bool:
    return bool(model.__dict__.get(COMPILED_STEP))


def restore(model: nn.Module) -> nn.Module:
    """Undo :func:`prepare_for_decoding` and forget every kept copy of the weights (packed
    oneDNN weights, casts, fused projections), the captured or compiled static searches and
    the mark of :func:`compile_step`, in place;
    returns ``model``."""
    plain_linears(model)
    for module in model.modules():
        if type(module) in _PLAIN:
            module.__class__ = _PLAIN[type(module)]
            if type(module) is MultiHeadAttention and is_quantized(module.q_proj):
                module.__class__ = StaticInt8Attention
        for name in ("_packed", "_cast", "cast_dtype", "_fused_layers", STATIC_SEARCHES, COMPILED_STEP):
            module.__dict__.pop(name, None)
    return model


def is_prepared(model: nn.Module) -> bool:
    return any(isinstance(m, FastAttention) for m in model.modules())


@contextlib.contextmanager
def prepared(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` prepared for the block: one already prepared stays so; a plain one (or any
    Seq2Seq without attention modules) is prepared without oneDNN, and restored after."""
    if is_prepared(model):
        yield model
        return
    prepare_for_decoding(model)
    try:
        yield model
    finally:
        restore(model)


def new_cache(model: nn.Module):
    """The cache a search decodes with: a :class:`PooledKVCache` for a prepared model, else
    the model's own (``model.new_cache()``; also any cache that is not a KVCache, such as an
    ensemble's, which holds its members' own)."""
    cache = model.new_cache()
    return PooledKVCache.empty(len(cache.layers)) if is_prepared(model) and isinstance(cache, KVCache) else cache
