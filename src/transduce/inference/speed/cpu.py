"""CPU linear layers for decoding: oneDNN matmuls, and dynamic int8 quantisation.

PyTorch's CPU ``F.linear`` calls the BLAS it was built with (MKL), which on some CPUs (AMD
in particular) takes a slower code path and scales badly across threads; oneDNN, which PyTorch
also ships, picks its kernels by instruction set (BENCHMARKS.md, "Decoding speed", has the
measurements). :class:`OneDNNLinear` keeps every parameter object, name and tie, and falls
back to ``F.linear`` whenever gradients, autocast or a non-CPU/non-fp32 tensor are involved, and
for small products (few rows).

Dynamic quantisation (Jacob et al., 2018; PyTorch's ``quantize_dynamic``) stores each
``nn.Linear`` weight as int8 with a per-tensor scale and quantises activations on the fly, per
batch: no calibration data, about 4x smaller linear layers, and faster matrix products on CPUs
with int8 instructions. Embeddings, LayerNorms and attention softmax stay in float32, and so
does the tied output projection's embedding-side copy (the projection itself is an
``nn.Linear`` and becomes int8).

Both are applied through :func:`~transduce.inference.fast.prepare_for_decoding`.
"""

from __future__ import annotations

import copy
import functools
import logging
import warnings

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .cast import CastLinear

logger = logging.getLogger(__name__)

# Row count the weights are packed for. oneDNN picks its kernel by it, but a packed weight
# is valid for any number of rows; 1 selects a slow path, a decoding batch's row count does not.
PACK_ROWS = 64

# Below this many multiply-adds (rows x in x out) a call takes F.linear: there oneDNN's fixed cost
# per call outweighs its faster kernel (BENCHMARKS.md, "Per-step overhead"), e.g. for the few rows
# left at the end of a greedy batch, or a one-sentence request.
ONEDNN_MIN_MACS = 2**19


@functools.lru_cache(maxsize=None)
def onednn_available() -> bool:
    """Whether this PyTorch build has the oneDNN linear op and it gives F.linear's answer.

    Checked once, with a private generator: the global RNG (dropout masks of a training run
    that validates through a Translator) must not move.
    """
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        g = torch.Generator().manual_seed(0)
        x, w, b = torch.randn(3, 5, generator=g), torch.randn(4, 5, generator=g), torch.randn(4, generator=g)
        y = torch.ops.mkldnn._linear_pointwise(x, torch.ops.mkldnn._reorder_linear_weight(w, PACK_ROWS), b,
                                               "none", [], "")
        return bool(torch.allclose(y, F.linear(x, w, b), atol=1e-5))
    except (RuntimeError, AttributeError):
        return False


class OneDNNLinear(nn.Linear):
    """``nn.Linear`` whose CPU float32 inference forward is oneDNN's matmul (same math).

    The weight is used in oneDNN's own blocked layout, reordered once and kept beside the
    parameter (rebuilt when the parameter's storage or version counter changes): reordering
    it on every call costs a sizeable share of a small matmul's time. Products smaller than
    ``ONEDNN_MIN_MACS`` take ``F.linear``.
    """

    def _fast(self, x: Tensor) -> bool:  # (F.linear too in a step torch.compile traces: the packed op does not trace)
        return (not torch.compiler.is_compiling() and x.is_cpu and x.dtype == torch.float32
                and not torch.is_grad_enabled() and x.numel() * self.out_features >= ONEDNN_MIN_MACS
                and not torch.is_autocast_enabled("cpu") and self.weight.dtype == torch.float32)

    def _packed_weight(self) -> Tensor:
        w = self.weight
        if w.is_inference():  # no version counter to tell when a packed copy is stale
            return w
        key = (w.data_ptr(), w._version, w.shape)
        packed = self.__dict__.get("_packed")
        if packed is None or packed[0] != key:
            with torch.inference_mode(False), torch.no_grad():
                packed = self.__dict__["_packed"] = (key, torch.ops.mkldnn._reorder_linear_weight(w, PACK_ROWS))
        return packed[1]

    def __getstate__(self) -> dict:  # copies and pickles leave the packed weight behind
        state = self.__dict__.copy()
        state.pop("_packed", None)
        return state

    def _matmul(self, x: Tensor, post_op: str) -> Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self._packed_weight(), self.bias, post_op, [], "")

    def forward(self, x: Tensor) -> Tensor:
        if not self._fast(x):
            return F.linear(x, self.weight, self.bias)
        return self._matmul(x, "none")

    def forward_relu(self, x: Tensor) -> Tensor:
        """relu(x W^T + b) with the ReLU applied inside the matmul's output loop (one pass
        over the (N, d_ff) activations fewer; see :class:`~transduce.inference.fast.FastFeedForward`)."""
        if not self._fast(x):
            return F.relu(F.linear(x, self.weight, self.bias))
        return self._matmul(x, "relu")


def plain_linears(model: nn.Module) -> None:
    """Turn this package's ``nn.Linear`` subclasses, which only change ``forward``
    (:class:`OneDNNLinear`, :class:`~.cast.CastLinear`), back into ``nn.Linear``, in place.
    Other subclasses (a quantisation-aware training layer, a static int8 one) stay as they are."""
    for module in model.modules():
        if type(module) in (OneDNNLinear, CastLinear):
            module.__class__ = nn.Linear
            module.__dict__.pop("_packed", None)


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
    plain_linears(target)  # quantize_dynamic matches exact types and would skip subclasses
    # torch.ao.quantization is deprecated in favour of torchao but still the one built-in path;
    # its warnings say so on every call, which is noise for users of this function.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=DeprecationWarning)
        warnings.simplefilter("ignore", category=UserWarning)
        return torch.ao.quantization.quantize_dynamic(target, {nn.Linear}, dtype=torch.qint8, inplace=True)
