"""Label-smoothed cross-entropy (Sec. 5.4, "Label Smoothing", eps_ls = 0.1)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class LossOutput:
    """Sums over non-pad target positions; divide by ``n_tokens`` for means."""

    loss: Tensor      # smoothed loss, the training objective (sum)
    nll: Tensor       # plain negative log-likelihood (sum), for perplexity
    n_tokens: int


def _nll_and_smooth(logp: Tensor, target: Tensor, weight: Tensor) -> tuple[Tensor, Tensor]:
    """Weighted sums of -log p(target) and of the mean -log p over the vocabulary.
    Shape: logp (N, V), target (N,), weight (N,) -> two scalars."""
    nll = -(logp.gather(-1, target.unsqueeze(-1)).squeeze(-1) * weight).sum()
    smooth = -(logp.sum(dim=-1) * weight).sum() / logp.shape[-1]
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
    the smoothed loss and of the NLL (scalars).
    """

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, weight: Tensor, smoothing: float) -> tuple[Tensor, Tensor]:
        logp = torch.log_softmax(logits, dim=-1)                        # (N, V)
        nll, smooth = _nll_and_smooth(logp, target, weight)
        ctx.save_for_backward(logp, target, weight)
        ctx.smoothing = smoothing
        return (1.0 - smoothing) * nll + smoothing * smooth, nll

    @staticmethod
    def backward(ctx, grad_loss: Tensor, grad_nll: Tensor) -> tuple[Tensor, None, None, None]:
        logp, target, weight = ctx.saved_tensors
        eps, v = ctx.smoothing, logp.shape[-1]
        # (the nll is returned detached by label_smoothed_loss; differentiating it is supported)
        scale = (weight * (grad_loss + grad_nll)).unsqueeze(-1)                 # (N, 1)
        shift = (weight * (grad_loss * eps / v)).unsqueeze(-1)                  # (N, 1)
        grad = torch.addcmul(-shift, logp.exp(), scale)                         # (N, V)
        hot = weight * (grad_loss * (1.0 - eps) + grad_nll)                     # (N,)
        grad.scatter_add_(-1, target.unsqueeze(-1), -hot.unsqueeze(-1).to(grad.dtype))
        return grad, None, None, None


def label_smoothed_loss(logits: Tensor, target: Tensor, smoothing: float, pad_id: int) -> LossOutput:
    """Cross-entropy against (1 - eps) * one_hot + eps / V, ignoring pad targets.

    This is exactly ``F.cross_entropy(logits, target, label_smoothing=eps, ignore_index=pad,
    reduction="sum")`` (the smoothing mass is spread over all V classes, the true one included),
    computed from one log-softmax so the NLL for perplexity comes for free; the backward pass
    is fused (:class:`_SmoothedCrossEntropy`).

    Shape: logits (B, T, V), target (B, T).
    """
    keep = target != pad_id                                             # (B, T)
    rows = logits.reshape(-1, logits.shape[-1])
    if rows.dtype in (torch.float16, torch.bfloat16):
        rows = rows.float()                                             # softmax in fp32 under autocast
    loss, nll = _SmoothedCrossEntropy.apply(rows, target.reshape(-1), keep.reshape(-1).to(rows.dtype), smoothing)
    return LossOutput(loss, nll.detach(), int(keep.sum()))


class _ProjectedSmoothedCrossEntropy(torch.autograd.Function):
    """The output projection and the label-smoothed loss together, a block of rows at a time.

    ``logits = hidden @ weight.T`` is never stored whole: for each block of ``chunk`` rows the
    forward computes the block's logits, its loss terms and, when gradients are wanted, its
    gradients right away (d logits = keep * (softmax - smoothed one-hot), then d hidden =
    d logits @ weight and d weight += d logits^T @ hidden), while the block is still in cache.
    The backward only scales them by the incoming gradient of the loss. With a small d_model and
    a large vocabulary the (N, V) logits dwarf the hidden states, so this removes most of the
    step's memory traffic outside the matmuls (BENCHMARKS.md, "Training throughput").

    Shape: hidden (N, D), weight (V, D), target (N,), keep (N,) float (1 = counted, 0 = pad)
    -> the sums of the smoothed loss and of the NLL (scalars).
    """

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, target: Tensor, keep: Tensor, smoothing: float,
                chunk: int) -> tuple[Tensor, Tensor]:
        want_h, want_w = ctx.needs_input_grad[:2]
        n, v = hidden.shape[0], weight.shape[0]
        grad_h = torch.empty_like(hidden) if want_h else None
        grad_w = torch.zeros_like(weight) if want_w else None
        nll = hidden.new_zeros(())
        smooth = hidden.new_zeros(())
        for s in range(0, n, chunk):
            h, t, k = hidden[s:s + chunk], target[s:s + chunk], keep[s:s + chunk]
            logp = torch.log_softmax(h @ weight.T, dim=-1)                 # (c, V)
            block_nll, block_smooth = _nll_and_smooth(logp, t, k)
            nll += block_nll
            smooth += block_smooth
            if want_h or want_w:
                g = logp.exp_().mul_(k.unsqueeze(-1)).sub_((k * (smoothing / v)).unsqueeze(-1))  # (c, V)
                g.scatter_add_(-1, t.unsqueeze(-1), -(k * (1.0 - smoothing)).unsqueeze(-1))
                if want_h:
                    torch.mm(g, weight, out=grad_h[s:s + chunk])
                if want_w:
                    grad_w.addmm_(g.T, h)
        ctx.save_for_backward(grad_h, grad_w)
        return (1.0 - smoothing) * nll + smoothing * smooth, nll

    @staticmethod
    def backward(ctx, grad_loss: Tensor, grad_nll: Tensor) -> tuple:
        grad_h, grad_w = ctx.saved_tensors
        if grad_nll is not None and bool(grad_nll != 0):
            raise RuntimeError("the projected loss returns the NLL for reporting only; it has no gradient")
        return (None if grad_h is None else grad_h * grad_loss, None if grad_w is None else grad_w * grad_loss,
                None, None, None, None)


def projected_label_smoothed_loss(hidden: Tensor, weight: Tensor, target: Tensor, smoothing: float,
                                  pad_id: int, chunk: int | None = None) -> LossOutput:
    """:func:`label_smoothed_loss` of ``hidden @ weight.T`` without storing those logits.

    The same value and gradients as ``label_smoothed_loss(F.linear(hidden, weight), ...)``
    (see :class:`_ProjectedSmoothedCrossEntropy`), for float32 training; the NLL is for
    reporting (no gradient). ``chunk`` rows per block: on CPU a block that stays in cache (the
    size measured fastest, BENCHMARKS.md); elsewhere a large one, since a block is a few kernel
    launches and small blocks would leave a GPU idle.

    Shape: hidden (B, T, D) (the decoder output before the output projection), weight (V, D),
    target (B, T).
    """
    keep = target != pad_id                                             # (B, T)
    rows = hidden.reshape(-1, hidden.shape[-1])
    if chunk is None:
        chunk = 256 if rows.device.type == "cpu" else 4096
    loss, nll = _ProjectedSmoothedCrossEntropy.apply(rows, weight, target.reshape(-1), keep.reshape(-1).to(rows.dtype),
                                                     smoothing, chunk)
    return LossOutput(loss, nll.detach(), int(keep.sum()))
