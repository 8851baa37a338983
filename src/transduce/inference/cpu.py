"""CPU inference speed-up: run the model's linear layers through oneDNN.

PyTorch's CPU ``F.linear`` calls the BLAS it was built with (MKL), which on some CPUs (AMD
in particular) takes a slower code path and scales badly across threads; oneDNN, which PyTorch
also ships, picks its kernels by instruction set. On the 2-core AMD EPYC where we benchmark,
the output projection (256 x 256 @ 256 x 8000) runs about 2x faster at batch 64 through
oneDNN (see BENCHMARKS.md). The swap keeps every parameter object, name and tie, and falls
back to ``F.linear`` whenever gradients, autocast or a non-CPU/non-fp32 tensor are involved.
"""

from __future__ import annotations

import functools
import logging

import torch
import torch.nn.functional as F
from torch import Tensor, nn

logger = logging.getLogger(__name__)

# Row count the weights are packed for. oneDNN picks its kernel by it, but a packed weight
# is valid for any number of rows; 1 selects a slow path, 64..1344 all measured alike.
PACK_ROWS = 64


@functools.lru_cache(maxsize=None)
def _onednn_ok() -> bool:
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
    it on every call cost 35% of the output projection's time at 64 rows, 16% at 256.
    """

    def _fast(self, x: Tensor) -> bool:
        return (x.device.type == "cpu" and x.dtype == torch.float32 and self.weight.dtype == torch.float32
                and not torch.is_grad_enabled() and not torch.is_autocast_enabled("cpu"))

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
        over the (N, d_ff) activations fewer; :class:`~transduce.model.layers.FeedForward`
        uses it when a layer offers it)."""
        if not self._fast(x):
            return F.relu(F.linear(x, self.weight, self.bias))
        return self._matmul(x, "relu")


def drop_inference_state(model: nn.Module) -> None:
    """Undo :func:`use_onednn_linears` and forget every kept inference copy of the weights
    (oneDNN-packed weights, fused Q/K/V layers), in place.

    The trainer calls it after validating through a :class:`~transduce.inference.Translator`,
    so the training model does not carry a second copy of its weights between validations.
    """
    for module in model.modules():
        if type(module) is OneDNNLinear:
            module.__class__ = nn.Linear
        module.__dict__.pop("_packed", None)
        module.__dict__.pop("_fused_layers", None)


def use_onednn_linears(model: nn.Module) -> int:
    """Switch every plain ``nn.Linear`` of ``model`` to :class:`OneDNNLinear`, in place.

    Returns the number of layers switched (0 when oneDNN is unavailable). Parameters, names
    and the state dict are unchanged; training (grad mode) still uses ``F.linear``.
    """
    if not _onednn_ok():
        logger.debug("oneDNN linear unavailable; keeping F.linear")
        return 0
    n = 0
    for module in model.modules():
        if type(module) is nn.Linear:
            module.__class__ = OneDNNLinear
            n += 1
    return n
