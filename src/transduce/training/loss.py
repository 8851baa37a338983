"""Label-smoothed cross-entropy (Sec. 5.4, "Label Smoothing", eps_ls = 0.1)."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ..device import autocast_dtype


@dataclass
class LossOutput:
    """Sums over non-pad target positions; divide by ``n_tokens`` for means."""

    loss: Tensor      # smoothed loss, the training objective (sum)
    nll: Tensor       # plain negative log-likelihood (sum), for perplexity
    n_tokens: Tensor  # non-pad target positions (0-dim long, on the loss's device: read it when needed)


def excluded_class(config: object) -> int | None:
    """The id that is no class of the model's output softmax: BOS where ``model.bos_in_softmax`` is
    false (an imported T5, whose BOS is PAD's row again: left out as T5's own loss and
    :func:`~transduce.inference.search.common.output_log_softmax` leave it out), else None."""
    return None if getattr(config, "bos_in_softmax", True) else config.bos_id


def _log_softmax(logits: Tensor, excluded: int | None) -> Tensor:
    """Log-softmax over the classes; ``excluded``'s column is left out of the softmax and set to 0,
    so that it adds nothing to the smoothing sum (and is 1, not 0, after exp: callers zero it).
    Writes into ``logits`` when a class is excluded. Shape: (N, V) -> (N, V)."""
    if excluded is None:
        return torch.log_softmax(logits, dim=-1)
    logits[:, excluded] = -math.inf
    logp = torch.log_softmax(logits, dim=-1)
    logp[:, excluded] = 0.0
    return logp


def _nll_and_smooth(logp: Tensor, target: Tensor, weight: Tensor, n_classes: int) -> tuple[Tensor, Tensor]:
    """Weighted sums of -log p(target) and of the mean -log p over the ``n_classes`` classes (an
    excluded column of ``logp`` holds 0, see :func:`_log_softmax`).
    Shape: logp (N, V), target (N,), weight (N,) -> two scalars."""
    nll = -(logp.gather(-1, target.unsqueeze(-1)).squeeze(-1) * weight).sum()
    smooth = -(logp.sum(dim=-1) * weight).sum() / n_classes
    return nll, smooth


class _SmoothedCrossEntropy(torch.autograd.Function):
    """Label-smoothed cross-entropy summed over weighted rows, with a hand-written backward.

    Autograd through log_softmax -> gather/mean -> weighted sum writes several (N, V) tensors
    in the backward pass (a zero-filled scatter for the gather, an expanded division for the
    mean, their sum, the log-softmax backward). The gradient has a closed form,
    d loss / d logits = softmax - ((1 - eps) * one_hot + eps / V), so the backward here is one
    exp and one multiply-add over (N, V) plus a scatter: the loss is memory-bound on CPU, and
    at small d_model its (N, V) passes cost as much as a layer's matmuls.

    Shape: logits (N, V) float, target (N,), weight (N,) (1 = counted, 0 = pad) -> the sums of
    the smoothed loss and of the NLL (scalars). An ``excluded`` class is no class at all: out of
    the softmax and of the smoothing's uniform share (which is eps / (V - 1) then), gradient 0.
    """

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, weight: Tensor, smoothing: float,
                excluded: int | None) -> tuple[Tensor, Tensor]:
        logp = _log_softmax(logits if excluded is None else logits.clone(), excluded)  # (N, V)
        ctx.n_classes = logp.shape[-1] - (excluded is not None)
        nll, smooth = _nll_and_smooth(logp, target, weight, ctx.n_classes)
        ctx.save_for_backward(logp, target, weight)
        ctx.smoothing, ctx.excluded = smoothing, excluded
        return (1.0 - smoothing) * nll + smoothing * smooth, nll

    @staticmethod
    def backward(ctx, grad_loss: Tensor, grad_nll: Tensor) -> tuple[Tensor, None, None, None, None]:
        logp, target, weight = ctx.saved_tensors
        eps, v = ctx.smoothing, ctx.n_classes
        # (the nll is returned detached by label_smoothed_loss; differentiating it is supported)
        scale = (weight * (grad_loss + grad_nll)).unsqueeze(-1)                 # (N, 1)
        shift = (weight * (grad_loss * eps / v)).unsqueeze(-1)                  # (N, 1)
        grad = torch.addcmul(-shift, logp.exp(), scale)                         # (N, V)
        if ctx.excluded is not None:
            grad[:, ctx.excluded] = 0.0
        hot = weight * (grad_loss * (1.0 - eps) + grad_nll)                     # (N,)
        grad.scatter_add_(-1, target.unsqueeze(-1), -hot.unsqueeze(-1).to(grad.dtype))
        return grad, None, None, None, None


def label_smoothed_loss(logits: Tensor, target: Tensor, smoothing: float, pad_id: int,
                        excluded: int | None = None) -> LossOutput:
    """Cross-entropy against (1 - eps) * one_hot + eps / V, ignoring pad targets.

    This is exactly ``F.cross_entropy(logits, target, label_smoothing=eps, ignore_index=pad,
    reduction="sum")`` (the smoothing mass is spread over all V classes, the true one included),
    computed from one log-softmax so the NLL for perplexity comes for free; the backward pass
    is fused (:class:`_SmoothedCrossEntropy`). With ``excluded`` (:func:`excluded_class`) it is
    that cross-entropy over the logits with that class's column removed.

    Shape: logits (B, T, V), target (B, T).
    """
    keep = target != pad_id                                             # (B, T)
    target = target.masked_fill(~keep, 0)  # a pad label may be no id (IGNORE_LABEL): gather a real one
    rows = logits.reshape(-1, logits.shape[-1])
    if rows.dtype in (torch.float16, torch.bfloat16):
        rows = rows.float()                                             # softmax in fp32 under autocast
    loss, nll = _SmoothedCrossEntropy.apply(rows, target.reshape(-1), keep.reshape(-1).to(rows.dtype), smoothing,
                                            excluded)
    return LossOutput(loss, nll.detach(), keep.sum())


# Rows per block of the projected loss away from the CPU: as many as make a block of about this
# many logits (8192 rows at a 32k vocabulary: 0.5 GB in bf16), so that a block's kernels are
# large enough to keep a GPU busy while the (N, V) logits are never stored whole.
BLOCK_ELEMENTS = 1 << 28


def _low_precision_block(logits: Tensor, target: Tensor, smoothing: float,
                         excluded: int | None) -> tuple[Tensor, Tensor, Tensor]:
    """One block of the low-precision projected loss: per row, -log p(target) and the mean -log p
    over the vocabulary (float32), and d loss / d logits = softmax - smoothed one-hot, in the
    logits' dtype. Written as pointwise ops over one float32 view so that ``torch.compile`` fuses
    the whole block into a reduction and a pointwise kernel (on CUDA, see :func:`_block_fn`).

    Shape: logits (c, V) bf16/fp16, target (c,) -> nll (c,), smooth (c,), grad (c, V).
    An ``excluded`` class is out of the softmax and of the smoothing (see :func:`_log_softmax`).
    """
    v = logits.shape[-1]
    x = logits.float()
    total = x.sum(dim=-1)                                                   # (c,)
    if excluded is not None:
        total = total - x[:, excluded]
        x[:, excluded] = -math.inf
        v -= 1
    lse = torch.logsumexp(x, dim=-1, keepdim=True)                          # (c, 1)
    nll = (lse - x.gather(-1, target.unsqueeze(-1))).squeeze(-1)
    smooth = lse.squeeze(-1) - total / v
    hot = torch.arange(x.shape[-1], device=x.device) == target.unsqueeze(-1)  # (c, V)
    grad = torch.exp(x - lse) - smoothing / v - hot * (1.0 - smoothing)
    if excluded is not None:
        grad[:, excluded] = 0.0
    return nll, smooth, grad.to(logits.dtype)


# _low_precision_block compiled for CUDA on first use (the plain function once compiling failed).
_COMPILED_BLOCK: dict[str, object] = {}


def _run_block(logits: Tensor, target: Tensor, smoothing: float, excluded: int | None) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`_low_precision_block`, compiled once on CUDA (dynamic shapes: the last block is
    shorter), plain elsewhere; a compiler failure falls back to the plain function, with a warning."""
    if logits.device.type != "cuda":
        return _low_precision_block(logits, target, smoothing, excluded)
    fn = _COMPILED_BLOCK.get("fn")
    if fn is None:
        fn = _COMPILED_BLOCK["fn"] = torch.compile(_low_precision_block, dynamic=True)
    try:
        return fn(logits, target, smoothing, excluded)
    except Exception as e:  # noqa: BLE001 - a compiler failure must not stop training
        if fn is _low_precision_block:
            raise
        logging.getLogger("transduce.training").warning(
            "compiling the fused loss failed (%s); running it eagerly", (str(e).splitlines() or [type(e).__name__])[0])
        _COMPILED_BLOCK["fn"] = _low_precision_block
        return _low_precision_block(logits, target, smoothing, excluded)


def _blocks_fp32(hidden: Tensor, weight: Tensor, bias: Tensor | None, target: Tensor, keep: Tensor,
                 smoothing: float, excluded: int | None, chunk: int, grad_h: Tensor | None, grad_w: Tensor | None,
                 grad_b: Tensor | None) -> tuple[Tensor, Tensor]:
    """The float32 blocks of :class:`_ProjectedSmoothedCrossEntropy`: the sums of the NLL and of
    the smoothing term; writes the gradients (not yet scaled) into ``grad_h``/``grad_w``/``grad_b``."""
    v = weight.shape[0] - (excluded is not None)
    nll = hidden.new_zeros(())
    smooth = hidden.new_zeros(())
    for s in range(0, hidden.shape[0], chunk):
        h, t, k = hidden[s:s + chunk], target[s:s + chunk], keep[s:s + chunk]
        logp = _log_softmax(F.linear(h, weight, bias), excluded)            # (c, V)
        block_nll, block_smooth = _nll_and_smooth(logp, t, k, v)
        nll += block_nll
        smooth += block_smooth
        if grad_h is not None or grad_w is not None:
            g = logp.exp_().mul_(k.unsqueeze(-1)).sub_((k * (smoothing / v)).unsqueeze(-1))  # (c, V)
            if excluded is not None:
                g[:, excluded] = 0.0
            g.scatter_add_(-1, t.unsqueeze(-1), -(k * (1.0 - smoothing)).unsqueeze(-1))
            if grad_h is not None:
                torch.mm(g, weight, out=grad_h[s:s + chunk])
            if grad_w is not None:
                grad_w.addmm_(g.T, h)
            if grad_b is not None:
                grad_b += g.sum(dim=0)
    return nll, smooth


def _blocks_mixed(hidden: Tensor, weight: Tensor, bias: Tensor | None, target: Tensor, keep: Tensor,
                  smoothing: float, excluded: int | None, chunk: int, dtype: torch.dtype, grad_h: Tensor | None,
                  grad_w: Tensor | None, grad_b: Tensor | None) -> tuple[Tensor, Tensor]:
    """:func:`_blocks_fp32` in mixed precision (see :class:`_ProjectedSmoothedCrossEntropy`)."""
    w = weight.to(dtype)
    b = None if bias is None else bias.to(dtype)
    nll = hidden.new_zeros((), dtype=torch.float32)
    smooth = hidden.new_zeros((), dtype=torch.float32)
    for s in range(0, hidden.shape[0], chunk):
        h, t, k = hidden[s:s + chunk].to(dtype), target[s:s + chunk], keep[s:s + chunk]
        block_nll, block_smooth, g = _run_block(F.linear(h, w, b), t, smoothing, excluded)  # g (c, V) in dtype
        nll += (block_nll * k).sum()
        smooth += (block_smooth * k).sum()
        if grad_h is not None:
            grad_h[s:s + chunk] = (g @ w) * k.unsqueeze(-1)
        if grad_w is not None:
            grad_w += (g.T @ (h * k.unsqueeze(-1).to(dtype))).float()
        if grad_b is not None:
            grad_b += (k.to(dtype) @ g).float()
    return nll, smooth


class _ProjectedSmoothedCrossEntropy(torch.autograd.Function):
    """The output projection and the label-smoothed loss together, a block of rows at a time.

    ``logits = hidden @ weight.T`` is never stored whole: for each block of ``chunk`` rows the
    forward computes the block's logits, its loss terms and, when gradients are wanted, its
    gradients right away (d logits = keep * (softmax - smoothed one-hot), then d hidden =
    d logits @ weight and d weight += d logits^T @ hidden), while the block is still in cache.
    The backward only scales them by the incoming gradient of the loss. With a small d_model and
    a large vocabulary the (N, V) logits dwarf the hidden states, so this removes most of the
    step's memory traffic outside the matmuls (BENCHMARKS.md, "Training throughput").

    ``dtype`` None computes in float32. A bf16/fp16 ``dtype`` is mixed precision as autocast
    does it: the projection's operands in ``dtype``, the softmax in float32, d logits rounded
    to ``dtype`` for the two gradient matmuls, d weight accumulated in float32; the pad rows are
    masked on the (c, D) side (d hidden rows, hidden rows) instead of the (c, V) side.

    Shape: hidden (N, D), weight (V, D), bias (V,) or None, target (N,), keep (N,) float
    (1 = counted, 0 = pad) -> the sums of the smoothed loss and of the NLL (scalars). An
    ``excluded`` class is no class (see :class:`_SmoothedCrossEntropy`).
    """

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, bias: Tensor | None, target: Tensor, keep: Tensor,
                smoothing: float, excluded: int | None, chunk: int, dtype: torch.dtype | None) -> tuple[Tensor, Tensor]:
        want_h, want_w, want_b = ctx.needs_input_grad[:3]
        grad_h = torch.empty_like(hidden) if want_h else None
        grad_w = torch.zeros_like(weight) if want_w else None
        grad_b = torch.zeros_like(bias) if want_b else None
        if dtype is None:
            nll, smooth = _blocks_fp32(hidden, weight, bias, target, keep, smoothing, excluded, chunk, grad_h, grad_w,
                                       grad_b)
        else:
            with torch.autocast(hidden.device.type, enabled=False):  # the dtypes are chosen by hand
                nll, smooth = _blocks_mixed(hidden, weight, bias, target, keep, smoothing, excluded, chunk, dtype,
                                            grad_h, grad_w, grad_b)
        ctx.save_for_backward(grad_h, grad_w, grad_b)
        return (1.0 - smoothing) * nll + smoothing * smooth, nll

    @staticmethod
    def backward(ctx, grad_loss: Tensor, grad_nll: Tensor) -> tuple:
        # The NLL is for reporting: the wrapper returns it detached, so its gradient is ignored
        # (checking that it is zero would cost a host sync every step).
        return (*(None if g is None else g * grad_loss for g in ctx.saved_tensors), None, None, None, None, None, None)


def projected_label_smoothed_loss(hidden: Tensor, weight: Tensor, target: Tensor, smoothing: float,
                                  pad_id: int, chunk: int | None = None, bias: Tensor | None = None,
                                  excluded: int | None = None) -> LossOutput:
    """:func:`label_smoothed_loss` of ``hidden @ weight.T (+ bias)`` without storing those logits.

    The same value and gradients as ``label_smoothed_loss(F.linear(hidden, weight, bias), ...)``
    (see :class:`_ProjectedSmoothedCrossEntropy`): in float32, or in mixed precision when
    called under bf16/fp16 autocast (as the model's forward is), matching what autocast gives
    the unfused pair within that precision. The NLL is for reporting (no gradient). ``chunk``
    rows per block: on CPU a block that stays in cache (the size measured fastest,
    BENCHMARKS.md); elsewhere :data:`BLOCK_ELEMENTS` logits' worth, since a block is a few
    kernel launches and small blocks would leave a GPU idle. No host synchronisation.

    Shape: hidden (B, T, D) (the decoder output before the output projection), weight (V, D),
    target (B, T), bias (V,) (``model.output_bias``) or None; ``excluded``: :func:`excluded_class`.
    """
    keep = target != pad_id                                             # (B, T)
    target = target.masked_fill(~keep, 0)  # a pad label may be no id (IGNORE_LABEL): gather a real one
    rows = hidden.reshape(-1, hidden.shape[-1])
    dtype = autocast_dtype(rows.device)
    if chunk is None:
        chunk = 256 if rows.device.type == "cpu" else max(64, BLOCK_ELEMENTS // weight.shape[0])
    keep_f = keep.reshape(-1).to(torch.float32 if dtype is not None else rows.dtype)
    loss, nll = _ProjectedSmoothedCrossEntropy.apply(rows, weight, bias, target.reshape(-1), keep_f, smoothing,
                                                     excluded, chunk, dtype)
    return LossOutput(loss, nll.detach(), keep.sum())
