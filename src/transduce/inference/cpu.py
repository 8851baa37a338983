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
        y = torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "")
        return bool(torch.allclose(y, F.linear(x, w, b), atol=1e-5))
    except (RuntimeError, AttributeError):
        return False


class OneDNNLinear(nn.Linear):
    """``nn.Linear`` whose CPU float32 inference forward is oneDNN's matmul (same math)."""

    def forward(self, x: Tensor) -> Tensor:
        fast = (x.device.type == "cpu" and x.dtype == torch.float32 and self.weight.dtype == torch.float32
                and not torch.is_grad_enabled() and not torch.is_autocast_enabled("cpu"))
        if not fast:
            return F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")


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
