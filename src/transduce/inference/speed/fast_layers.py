"""Attention and feed-forward for decoding: the model's own classes with fused projections,
key/value rows shared by a sentence's beams, and small-query attention as two batched matmuls.

Only ever switched in by :func:`~transduce.inference.speed.prepare_for_decoding`.

Legend: B query rows, Bk = B / g key/value rows, H heads, Tq/Tk query/key length, Dh head dim.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...model.attention import MultiHeadAttention, scaled_dot_product_attention
from ...model.masks import apply_mask
from ...model.layers import FeedForward
from .cast import CastLinear
from .cpu import OneDNNLinear
from .static_int8 import Int8Kernel, StaticInt8Linear, is_quantized

# Up to this many queries per row, CPU attention runs as two batched matmuls (_few_queries).
FEW_QUERIES = 8


def _few_queries(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float | None = None) -> Tensor:
    """Eq. 1 as two batched matmuls over B*H: faster on CPU than the fused kernel for the few
    queries per row of incremental decoding (BENCHMARKS.md, "Decoding speed"). ``scale``
    replaces 1 / sqrt(Dh); the mask is boolean or additive.

    Shape: q (B, H, Tq, Dh), k and v (B, H, Tk, Dh), mask broadcastable to (B, H, Tq, Tk)
    -> (B, H, Tq, Dh).
    """
    b, h, t_q, dh = q.shape
    t_k = k.shape[-2]
    scores = torch.bmm(q.reshape(b * h, t_q, dh), k.reshape(b * h, t_k, dh).transpose(1, 2))  # (BH, Tq, Tk)
    scores = scores.view(b, h, t_q, t_k).mul_(1.0 / math.sqrt(dh) if scale is None else scale)
    if mask is not None:  # (a boolean mask as one op: no inverted copy of it each step)
        scores = apply_mask(scores, mask) if mask.is_floating_point() else torch.where(mask, scores, -math.inf)
    if scores.dtype != torch.float32:
        scores = scores.float()
    weights = torch.softmax(scores, dim=-1)
    if weights.dtype != q.dtype:
        weights = weights.to(q.dtype)
    return torch.bmm(weights.view(b * h, t_q, t_k), v.reshape(b * h, t_k, dh)).view(b, h, t_q, dh)


def repeat_shared_rows(b: int, k: Tensor, v: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor, Tensor | None]:
    """k, v and a mask of Bk rows, each shared by g = B / Bk consecutive query rows (see
    :func:`fast_attention`), repeated to B rows."""
    b_kv = k.shape[0]
    if b == b_kv:
        return k, v, mask
    g = b // b_kv
    k, v = k.repeat_interleave(g, dim=0), v.repeat_interleave(g, dim=0)
    if mask is not None and mask.shape[0] == b_kv:
        mask = mask.repeat_interleave(g, dim=0)
    return k, v, mask


def fast_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, dropout: float = 0.0,
    is_causal: bool = False, need_weights: bool = False, scale: float | None = None,
) -> tuple[Tensor, Tensor | None]:
    """:func:`~transduce.model.attention.scaled_dot_product_attention`, with keys/values that
    may be shared by groups of consecutive query rows (the beams of a sentence attending to its
    encoder output).

    With Bk = B / g rows of k, v and mask, query row i reads key row i // g. With one query per
    row (incremental decoding) the g queries of a group are attended as one row of g queries,
    which reads each key once instead of g times.

    Shape: q (B, H, Tq, Dh), k and v (B or B/g, H, Tk, Dh), mask broadcastable to
    (B or B/g, H, Tq, Tk) -> output (B, H, Tq, Dh), weights (B, H, Tq, Tk) or None.
    """
    b, b_kv = q.shape[0], k.shape[0]
    if b != b_kv:
        if b % b_kv or (mask is not None and mask.shape[0] not in (1, b_kv)):
            raise ValueError(f"{b} query rows cannot share {b_kv} key/value rows")
        g = b // b_kv
        if q.shape[-2] == 1 and not is_causal:
            h, dh = q.shape[1], q.shape[-1]
            grouped = q.view(b_kv, g, h, dh).transpose(1, 2)                  # (Bk, H, g, Dh)
            out, weights = fast_attention(grouped, k, v, mask, dropout, False, need_weights, scale)
            out = out.transpose(1, 2).reshape(b, h, 1, dh)
            if weights is not None:
                weights = weights.transpose(1, 2).reshape(b, h, 1, -1)
            return out, weights
        k, v, mask = repeat_shared_rows(b, k, v, mask)
    if (not need_weights and not is_causal and q.device.type == "cpu" and not dropout
            and q.shape[-2] <= FEW_QUERIES):
        return _few_queries(q, k, v, mask, scale), None
    return scaled_dot_product_attention(q, k, v, mask, dropout, is_causal, need_weights, scale)


def _same_layout(layer: nn.Linear, w: Tensor, b: Tensor | None) -> bool:
    """Whether ``layer``'s weight and bias can take ``w`` and ``b`` in place."""
    same = layer.weight.shape == w.shape and layer.weight.dtype == w.dtype and layer.weight.device == w.device
    return same and (b is None) == (layer.bias is None)


def _linear_like(kind: nn.Linear, w: Tensor, b: Tensor | None) -> nn.Linear:
    """A linear layer of ``kind``'s class and settings over ``w`` (out, in) and ``b`` (out,),
    which it holds as they are (no copy, no gradients)."""
    layer = nn.Linear(w.shape[1], w.shape[0], bias=b is not None, device="meta")
    layer.weight = nn.Parameter(w, requires_grad=False)
    layer.bias = nn.Parameter(b, requires_grad=False) if b is not None else None
    layer.__class__ = type(kind)
    if isinstance(kind, CastLinear):
        layer.cast_dtype = kind.cast_dtype
    return layer


def _weights_key(names: tuple[str, ...], mods: list[nn.Module]) -> tuple | None:
    """What a fused layer of ``mods`` was made from: their kind and each weight's and bias's
    storage, version counter and dtype (a change of any makes it stale); None when one is an
    inference tensor (no version counter: never kept)."""
    weights = [m._parameters.get("weight") for m in mods]  # (a quantised layer's may be no parameter)
    params = weights + [m._parameters["bias"] for m in mods if m._parameters.get("bias") is not None]
    if any(w is None for w in weights) or any(p.is_inference() for p in params):
        return None
    return (names, type(mods[0])) + tuple((p.data_ptr(), p._version, p.dtype) for p in params)


class FastAttention(MultiHeadAttention):
    """:class:`~transduce.model.attention.MultiHeadAttention` with fused projections and
    :func:`fast_attention`. Only ever made by :func:`prepare_for_decoding` (a class switch)."""

    def _fused(self, names: tuple[str, ...]):
        """One linear layer computing the named projections side by side, or None.

        A single matmul of width 3D (or 2D) runs faster than three (two) of width D: it reads
        the input once and gives the kernels wider tiles. With gradients on, the weights are
        concatenated on each call, so autograd sees the real parameters. Without, the fused
        layer is kept, and when a weight changes (storage or version counter) its weights are
        rewritten in place: a CUDA graph that read them by address reads the new ones. It has
        the kind of ``q_proj`` (so a :class:`OneDNNLinear` or :class:`CastLinear` stays one).
        Static int8 layers sharing an input scale run as one :class:`~.static_int8.Int8Kernel`
        (their weights never change); other quantised layers are not fused.
        """
        mods = [self._modules[n] for n in names]  # (not nn.Module.__getattr__: this runs every step)
        cached = self._fused_cache.get(names)
        if cached is not None and torch.compiler.is_compiling():
            return cached[1]  # a compiled step reads the kept layer (refreshed before each search)
        if cached is not None and cached[0] is not None and not torch.is_grad_enabled() \
                and cached[0] == _weights_key(names, mods):
            return cached[1]  # the kept layer, up to date (the slow path below made the key)
        if all(isinstance(m, StaticInt8Linear) for m in mods):
            if names not in self._fused_cache:
                self._fused_cache[names] = (None, Int8Kernel.side_by_side(mods))
            return self._fused_cache[names][1]
        if not all(isinstance(m, nn.Linear) and not is_quantized(m) for m in mods):
            return None
        params = [m.weight for m in mods] + [m.bias for m in mods if m.bias is not None]

        def side_by_side() -> tuple[Tensor, Tensor | None]:
            return (torch.cat([m.weight for m in mods]),
                    torch.cat([m.bias for m in mods]) if mods[0].bias is not None else None)

        if torch.compiler.is_compiling() or (torch.is_grad_enabled() and any(p.requires_grad for p in params)) \
                or any(p.is_inference() for p in params):
            # (inference tensors keep no version counter to tell when a kept copy is stale)
            w, b = side_by_side()
            return lambda x: F.linear(x, w, b)
        key = _weights_key(names, mods)
        if cached is None or cached[0] != key:
            with torch.inference_mode(False), torch.no_grad():
                w, b = side_by_side()
                if cached is not None and cached[0] is not None and cached[0][:2] == key[:2] \
                        and _same_layout(cached[1], w, b):
                    fused = cached[1]
                    fused.weight.copy_(w)  # in place (see above)
                    if b is not None:
                        fused.bias.copy_(b)
                else:
                    fused = _linear_like(mods[0], w, b)
            cached = self._fused_cache[names] = (key, fused)
        return cached[1]

    def refresh(self) -> None:
        """Bring the kept fused layers (and their own kept casts) up to date with the
        projections' weights, in place."""
        with torch.no_grad():
            for names in list(self.__dict__.get("_fused_layers", ())):
                fused = self._fused(names)
                if isinstance(fused, CastLinear):
                    fused.refresh()

    def __getstate__(self) -> dict:  # copies and pickles leave the fused layers behind
        state = self.__dict__.copy()
        state.pop("_fused_layers", None)
        return state

    @property
    def _fused_cache(self) -> dict:
        cache = self.__dict__.get("_fused_layers")
        if cache is None:  # a plain attribute: not a submodule, not in the state dict
            cache = self.__dict__["_fused_layers"] = {}
        return cache

    def project(self, x: Tensor, layers: tuple[nn.Linear, ...]) -> tuple[Tensor, ...]:
        """The model's side-by-side projection, with the fused layer kept between calls (or
        each layer on its own when they are not ``nn.Linear``: quantised)."""
        names = tuple(n for n in ("q_proj", "k_proj", "v_proj") if getattr(self, n) in layers)
        fused = self._fused(names)
        if fused is None:
            return tuple(self.split_heads(m(x)) for m in layers)
        b, t, _ = x.shape
        n = len(layers)
        # (B, T, n*H*Dh) -> n of (B, H, T, Dh): the views of the model's chunk and split_heads, in 3 ops
        return fused(x).view(b, t, n, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)

    def project_kv(self, x: Tensor, start: int = 0) -> tuple[Tensor, Tensor]:
        """Keys and values, contiguous: they are projected once (the encoder output) and read
        at every step, which would otherwise copy the strided heads each time."""
        k, v = super().project_kv(x, start)
        return k.contiguous(), v.contiguous()

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, is_causal: bool = False,
               need_weights: bool = False, start: int = 0) -> tuple[Tensor, Tensor | None]:
        if not self.is_full:  # local and Linformer attention keep the model's own kernel
            k, v, mask = repeat_shared_rows(q.shape[0], k, v, mask)
            return super().attend(q, k, v, mask, is_causal, need_weights, start)
        dropout = self.dropout if self.training else 0.0
        out, weights = fast_attention(q, k, v, mask, dropout, is_causal, need_weights, self.scale)
        b, _, t, _ = out.shape
        # (B, Tq, H*Dh); one query: the same order of elements, one op fewer each step
        merged = out.reshape(b, 1, -1) if t == 1 else out.transpose(1, 2).reshape(b, t, -1)
        return self.out_proj(merged), weights                                        # (B, Tq, D)


class FastFeedForward(FeedForward):
    """:class:`~transduce.model.layers.FeedForward` whose ReLU runs inside the first matmul's
    output loop when that layer is a :class:`OneDNNLinear` (one pass over (N, d_ff) fewer)."""

    def forward(self, x: Tensor) -> Tensor:
        if self.activation == "relu" and isinstance(self.fc1, OneDNNLinear):
            h = self.fc1.forward_relu(x)
            return self.fc2(self.dropout(h) if self.training else h)
        return super().forward(x)
