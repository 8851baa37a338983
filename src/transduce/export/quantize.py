"""Dynamic int8 quantisation of the eager model for CPU inference.

Dynamic quantisation (Jacob et al., 2018; PyTorch's ``quantize_dynamic``) stores each
``nn.Linear`` weight as int8 with a per-tensor scale and quantises activations on the fly, per
batch: no calibration data, about 4x smaller linear layers, and faster matrix products on CPUs
with int8 instructions. Embeddings, LayerNorms and attention softmax stay in float32, and so
does the tied output projection's embedding-side copy (the projection itself is an
``nn.Linear`` and becomes int8).
"""

from __future__ import annotations

import copy
import warnings

import torch
from torch import nn


def quantize_dynamic_int8(model: nn.Module, inplace: bool = False) -> nn.Module:
    """A copy of ``model`` (eval mode, CPU) whose ``nn.Linear`` layers run in dynamic int8.

    Args:
        model: a float model, e.g. :class:`~transduce.model.Transformer`.
        inplace: quantise ``model`` itself instead of a deep copy.

    Returns:
        The quantised model; ``encode``/``decode``/KV cache work unchanged.

    Examples:
        >>> from transduce.config import model_preset
        >>> from transduce.model import Transformer
        >>> q = quantize_dynamic_int8(Transformer(model_preset("tiny", src_vocab_size=50, tgt_vocab_size=50)))
        >>> q.output_proj._get_name()
        'DynamicQuantizedLinear'
    """
    target = model if inplace else copy.deepcopy(model)
    target = target.to("cpu").float().eval()
    _plain_linears(target)
    # torch.ao.quantization is deprecated in favour of torchao but still the one built-in path;
    # its warnings say so on every call, which is noise for users of this function.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=DeprecationWarning)
        warnings.simplefilter("ignore", category=UserWarning)
        return torch.ao.quantization.quantize_dynamic(target, {nn.Linear}, dtype=torch.qint8, inplace=True)


def _plain_linears(model: nn.Module) -> None:
    """Turn ``nn.Linear`` subclasses that only change ``forward`` (such as the Translator's
    OneDNNLinear) back into ``nn.Linear``: ``quantize_dynamic`` matches exact types and would
    silently skip them."""
    for module in model.modules():
        if isinstance(module, nn.Linear) and type(module) is not nn.Linear \
                and set(module.state_dict()) <= {"weight", "bias"}:
            module.__class__ = nn.Linear


def quantize_translator(translator):
    """Replace a :class:`~transduce.inference.Translator`'s model by its int8 version (CPU only).

    Raises:
        ExportError: the translator runs on a GPU (dynamic int8 kernels are CPU kernels).
    """
    from .base import ExportError

    if translator.device.type != "cpu":
        raise ExportError(f"--int8: dynamic int8 quantisation runs on CPU only; got device {translator.device} "
                          "(use --device cpu)")
    translator.model = quantize_dynamic_int8(translator.model, inplace=True)
    return translator
