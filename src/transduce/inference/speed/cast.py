"""Linear layers that, under autocast, read low-precision copies of their weights kept between calls.

Autocast casts a float32 weight to its dtype at each call of a linear layer, or once per
autocast block with its cache on. A step captured in a CUDA graph must run with the cache off
(PyTorch's CUDA graphs notes: a cached cast is freed when the block that made it ends, while
the graph still reads it), so every replay would cast every weight again. :class:`CastLinear`
keeps the copies itself instead, cast once, and recast *in place* (``copy_``) when the
parameter changes: a graph reads a tensor by address, so a replaced copy would leave it reading
the old one. :func:`~transduce.inference.speed.refresh` brings the copies up to date before a
replay.

Only ever switched in by :func:`~transduce.inference.speed.prepare_for_decoding` (``cast=``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...device import autocast_dtype


class CastLinear(nn.Linear):
    """``nn.Linear`` whose forward under autocast to ``cast_dtype`` reads copies of its weight
    and bias in that dtype, kept beside the parameters (see the module docstring).

    The values are autocast's own: one rounding of the same float32 numbers, and ``F.linear``
    under autocast leaves weights already in its dtype as they are. With gradients on, another
    autocast dtype, outside autocast, or for weights that are not float32: plain ``F.linear``.
    """

    cast_dtype: torch.dtype  # set by prepare_for_decoding (an instance attribute, not state)

    def forward(self, x: Tensor) -> Tensor:
        if autocast_dtype(x.device) == self.cast_dtype and not (torch.is_grad_enabled() and self.weight.requires_grad):
            casts = self._casts()
            if casts is not None:
                return F.linear(x, *casts)
        return F.linear(x, self.weight, self.bias)

    def _casts(self) -> tuple[Tensor, Tensor | None] | None:
        """The kept (weight, bias) in ``cast_dtype``, recast in place when a parameter's
        storage or version counter has changed; None for weights that cannot be kept
        (not float32, or inference tensors, which keep no version counter)."""
        params = [p for p in (self.weight, self.bias) if p is not None]
        if self.weight.dtype != torch.float32 or any(p.is_inference() for p in params):
            return None
        key = tuple((p.data_ptr(), p._version, p.shape, p.device) for p in params)
        kept = self.__dict__.get("_cast")
        if kept is not None and kept[0] == key:
            return kept[1]
        with torch.inference_mode(False), torch.no_grad():
            if kept is not None and [k[2:] for k in kept[0]] == [k[2:] for k in key]:  # same shapes, device
                casts = kept[1]
                for cast, p in zip(casts, params):
                    cast.copy_(p)  # in place: a captured graph reads this copy by address
            else:
                casts = (self.weight.to(self.cast_dtype), None if self.bias is None else self.bias.to(self.cast_dtype))
        self.__dict__["_cast"] = (key, casts)
        return casts

    def refresh(self) -> None:
        """Bring the kept copies (if any) up to date with the parameters, in place."""
        if "_cast" in self.__dict__:
            self._casts()

    def __getstate__(self) -> dict:  # copies and pickles leave the kept copies behind
        state = self.__dict__.copy()
        state.pop("_cast", None)
        return state
