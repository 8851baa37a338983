"""Attention over gathered rows, flash-style: the one kernel under BigBird's blocks
(:mod:`~transduce.model.bigbird`) and LSH's chunks (:mod:`~transduce.model.lsh`).

A *plan* is a function returning the steps of one attention; a step is a batch of G groups, and
a group is Lq query rows attending to Lk key rows under an additive bias:

* ``rows`` (B, H, G, Lq) and ``cols`` (B, H, G, Lk): positions 0 .. T - 1, or T for none (an
  empty slot: masked as a key, its output dropped);
* ``bias`` broadcastable to (B, H, G, Lq, Lk): 0 where the key is visible, -inf where it is not,
  or a penalty; -inf on the key slots that are none (in the rows that are not).

A query row may sit in several groups, never twice in one step: its output is the softmax over
the keys of all its groups together (a key seen in two groups counts twice: LSH's rounds), the
steps folded in as flash attention folds its key blocks (Dao et al., 2022,
https://arxiv.org/abs/2205.14135, Alg. 1).

Nothing gathered is kept for the backward pass: only q, k, v, the output and each row's softmax
statistics (its max score and its sum of exp(score - max): the log-sum-exp in two parts, so that
a large penalty, as LSH's on a token's own key, cancels exactly), as flash attention keeps. The
backward pass runs the plan again, recomputes each step's probabilities from those statistics
and adds each step's dQ, dK, dV into place with ``index_add_`` (FlashAttention-2's backward,
https://arxiv.org/abs/2307.08691, Alg. 2, with D = rowsum(dO * O)); dropout masks are drawn again
from a seed per step. So the memory this attention holds grows with T by q, k, v, their
gradients and the output alone; a step's scores and gathered rows are the only other tensors,
and a plan sizes its steps by :func:`step_size`.

Legend: B batch, H heads, T length, Dh head dim, G groups in a step, Lq query rows and Lk key
rows of a group.
"""

from __future__ import annotations

import math
from typing import Callable, Iterable, NamedTuple

import torch
from torch import Tensor

STEP_SCORES = 2 ** 16  # scores per (batch, head) in one step: bounds a step's temporaries; larger steps were
# no faster on a CPU at 4k tokens, and their temporaries set the peak (BENCHMARKS.md)
STEP_SCORES_PER_POSITION = 16  # below 4k positions, fewer: a step's temporaries stay small beside q, k, v


def step_size(t: int) -> int:
    """The scores per (batch, head) of one step at length ``t``: :data:`STEP_SCORES`, or for a
    short input :data:`STEP_SCORES_PER_POSITION` per position, so that a step's temporaries stay
    a fraction of q, k and v (T x Dh each), as SDPA's flash kernel's do, instead of being as
    large as at 16k."""
    return min(STEP_SCORES, STEP_SCORES_PER_POSITION * t)
NORM_EPS = 1e-12  # F.normalize's


class Step(NamedTuple):
    """G groups of query rows over key rows (see the module docstring)."""

    rows: Tensor  # (B, H, G, Lq) long, T = none
    cols: Tensor  # (B, H, G, Lk) long, T = none
    bias: Tensor  # broadcastable to (B, H, G, Lq, Lk); -inf where cols is T


Plan = Callable[[], Iterable[Step]]


def gathered_attention(q: Tensor, k: Tensor, v: Tensor, plan: Plan, dropout: float = 0.0,
                       unit_keys: bool = False) -> Tensor:
    """Softmax attention of every query row over the keys its plan's groups give it; with
    ``unit_keys``, over the keys scaled to unit length (``F.normalize``; Reformer's shared-QK
    attention), done on each step's gathered rows so that no normalised copy of k is stored.

    Shape: q, k, v (B, H, T, Dh) -> (B, H, T, Dh); a row in no group gets zeros.
    """
    seed = int(torch.randint(2 ** 62, (1,))) if dropout > 0 else 0  # from the global generator: seedable
    return _GatheredAttention.apply(q, k, v, _Run(plan, dropout, seed, unit_keys))


class _Run(NamedTuple):
    """What one call runs, beside its tensors."""

    plan: Plan
    dropout: float
    seed: int          # step i's dropout mask is drawn from seed + i
    unit_keys: bool


class _GatheredAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, run: _Run) -> Tensor:
        b, h, t, dh = q.shape
        acc = q.new_zeros(b, h, t + 1, dh, dtype=_acc(q))                  # row T: the empty slots'
        top = q.new_full((b, h, t + 1), -math.inf, dtype=_acc(q))          # each row's running max score
        total = q.new_zeros(b, h, t + 1, dtype=_acc(q))                    # and sum of exp(score - max)
        with torch.autocast(q.device.type, enabled=False):
            for i, step in enumerate(run.plan()):
                s = _scores(_take(q, step.rows), _keys(k, step.cols, run.unit_keys)[0], step)  # (B, H, G, Lq, Lk)
                s_top = s.amax(-1)                                         # (B, H, G, Lq)
                e = s.sub_(_finite(s_top)[..., None]).exp_()
                o = _dropped(e, run.dropout, run.seed + i).to(v.dtype) @ _take(v, step.cols)  # (B, H, G, Lq, Dh)
                _merge(acc, top, total, step.rows, o, s_top, e.sum(-1))
        total.masked_fill_(total == 0, 1.0)                                 # a row with no key: output 0
        out = acc[:, :, :t].div_(total[:, :, :t, None]).to(q.dtype)        # (B, H, T, Dh): in acc's place
        ctx.save_for_backward(q, k, v, out, top, total)
        ctx.run = run
        return out

    @staticmethod
    def backward(ctx, d_out: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, out, top, total = ctx.saved_tensors
        grads = [torch.zeros(x.shape, dtype=_acc(q), device=x.device) for x in (q, k, v)]
        with torch.autocast(q.device.type, enabled=False):
            for i, step in enumerate(ctx.run.plan()):
                _step_backward(q, k, v, (out, d_out, top, total), step, grads, ctx.run, ctx.run.seed + i)
        return tuple(g.to(x.dtype) for g, x in zip(grads, (q, k, v))) + (None,)


def _scores(qs: Tensor, ks: Tensor, step: Step) -> Tensor:
    """A step's scores (B, H, G, Lq, Lk) in :func:`_acc`'s dtype: q.k / sqrt(Dh) + bias; ``qs``
    (B, H, G, Lq, Dh) and ``ks`` (B, H, G, Lk, Dh) the step's queries and keys."""
    s = (qs @ ks.transpose(-2, -1)).to(_acc(qs))                            # (B, H, G, Lq, Lk)
    return s.mul_(1 / math.sqrt(qs.shape[-1])).add_(step.bias)


def _step_backward(q: Tensor, k: Tensor, v: Tensor, saved: tuple[Tensor, ...], step: Step, grads: list[Tensor],
                   run: _Run, seed: int) -> None:
    """Adds one step's dQ, dK, dV into ``grads`` ((B, H, T, Dh) each, in :func:`_acc`'s dtype).
    ``saved``: the output and its gradient (B, H, T, Dh), each row's max score and sum of
    exp(score - max) over all its groups (B, H, T + 1). Each gathered tensor is dropped as soon
    as it is used (``del``): a step's working memory is what bounds the peak, not what is kept."""
    out, d_out, top, total = saved
    qs = _take(q, step.rows)                                                # (B, H, G, Lq, Dh)
    unit, norm = _keys(k, step.cols, run.unit_keys)                         # (B, H, G, Lk, Dh), (.., 1)
    p = _probabilities(qs, unit, step, top, total)                          # (B, H, G, Lq, Lk): the forward's
    dos = _take(d_out, step.rows).masked_fill_((step.rows == q.shape[-2])[..., None], 0.0)  # (B, H, G, Lq, Dh)
    d = (dos.to(p.dtype) * _take(out, step.rows)).sum(-1)                   # (B, H, G, Lq): D = rowsum(dO * O)
    dp = (dos @ _take(v, step.cols).transpose(-2, -1)).to(p.dtype)          # (B, H, G, Lq, Lk)
    ds = _score_grad(p, dp, dos, d, (grads[2], step.cols), run.dropout, seed)  # adds dV
    del p, dos, d
    _add_rows(grads[0], step.rows, ds @ unit)                               # dQ: (B, H, G, Lq, Dh)
    d_unit = ds.transpose(-2, -1) @ qs                                      # (B, H, G, Lk, Dh)
    del ds, qs
    _add_rows(grads[1], step.cols, _unit_grad(unit, norm, d_unit) if run.unit_keys else d_unit)


def _probabilities(qs: Tensor, ks: Tensor, step: Step, top: Tensor, total: Tensor) -> Tensor:
    """The forward's softmax probabilities of a step (B, H, G, Lq, Lk), from each row's max score
    and sum ``top``, ``total`` (B, H, T + 1); 0 in the rows that are none."""
    at = _index(top, step.rows)
    row_top = _finite(top[at])[..., None].masked_fill((step.rows == top.shape[-1] - 1)[..., None], math.inf)
    return _scores(qs, ks, step).sub_(row_top).exp_().div_(total[at][..., None])


def _score_grad(p: Tensor, dp: Tensor, dos: Tensor, d: Tensor, dv: tuple[Tensor, Tensor], dropout: float,
                seed: int) -> Tensor:
    """dS (B, H, G, Lq, Lk) of a step's scores (FlashAttention-2's dS = P * (dP - D), scaled), in
    dP's place, adding the step's dV (P^T dO) into ``dv`` = (the gradient (B, H, T, Dh), the
    step's cols). ``p`` the probabilities, ``dp`` dO V^T (B, H, G, Lq, Lk), ``dos`` dO
    (B, H, G, Lq, Dh), ``d`` rowsum(dO * O) (B, H, G, Lq); dropout's mask is drawn again from ``seed``."""
    keep = _dropped(torch.ones_like(p), dropout, seed) if dropout > 0 else None  # the forward's mask
    _add_rows(dv[0], dv[1], (p if keep is None else p * keep).to(dos.dtype).transpose(-2, -1) @ dos)  # (.., Lk, Dh)
    if keep is not None:
        dp.mul_(keep)
    return dp.sub_(d[..., None]).mul_(p).mul_(1 / math.sqrt(dos.shape[-1])).to(dos.dtype)


def _keys(k: Tensor, cols: Tensor, unit: bool) -> tuple[Tensor, Tensor | None]:
    """A step's keys (B, H, G, Lk, Dh), scaled to unit length if ``unit`` as ``F.normalize``
    scales them (x / max(|x|, eps)), and their lengths |x| (B, H, G, Lk, 1) (None if not)."""
    ks = _take(k, cols)
    if not unit:
        return ks, None
    norm = ks.norm(dim=-1, keepdim=True)
    return ks.div_(norm.clamp_min(NORM_EPS)), norm


def _unit_grad(unit: Tensor, norm: Tensor, g: Tensor) -> Tensor:
    """The gradient at x of ``F.normalize(x, dim=-1)`` = x / max(|x|, eps), given its output
    ``unit`` (n = x / |x| where |x| > eps), |x| ``norm`` and g for its output:
    (g - n (n . g)) / |x|, or g / eps where |x| <= eps; computed in g's place."""
    along = (unit * g).sum(-1, keepdim=True).masked_fill_(norm <= NORM_EPS, 0.0)  # (B, H, G, Lk, 1)
    return g.addcmul_(unit, along, value=-1).div_(norm.clamp_min(NORM_EPS))


def _index(x: Tensor, at: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The index of entries ``at`` (B, H, ...) along dim 2 of x (B, H, N, ...): advanced indexing
    copies whole rows, several times faster on CPU than ``gather`` with an index expanded to Dh."""
    lead = (1,) * (at.dim() - 2)
    return (torch.arange(x.shape[0], device=x.device).view(-1, 1, *lead),
            torch.arange(x.shape[1], device=x.device).view(1, -1, *lead), at)


def _take(x: Tensor, at: Tensor) -> Tensor:
    """Rows ``at`` (B, H, G, L) of x (B, H, T, Dh); T (none) reads row T - 1, which the plan's
    bias masks as a key and the backward pass as a query -> (B, H, G, L, Dh)."""
    return x[_index(x, at.clamp(max=x.shape[-2] - 1))]


def _add_rows(x: Tensor, at: Tensor, rows: Tensor) -> None:
    """x[b, h, at[b, h, ...]] += rows, repeated positions summed; T (none) adds to row T - 1
    (those rows are zero). Shape: x (B, H, T, Dh), at (B, H, G, L), rows (B, H, G, L, Dh)."""
    b, h, t, dh = x.shape
    base = torch.arange(b * h, device=x.device).view(b, h, 1) * t            # (B, H, 1): each (b, h)'s first row
    flat = (at.clamp(max=t - 1).flatten(2) + base).flatten()                # (B*H*G*L,)
    x.view(-1, dh).index_add_(0, flat, rows.reshape(-1, dh).to(x.dtype))


def _merge(acc: Tensor, top: Tensor, total: Tensor, rows: Tensor, o: Tensor, o_top: Tensor, o_total: Tensor) -> None:
    """Folds a step into the running sums, as flash attention folds a key block: the step's
    unnormalised outputs ``o`` (B, H, G, Lq, Dh), its rows' max scores ``o_top`` and sums of
    exp(score - max) ``o_total`` (B, H, G, Lq) into ``acc`` (B, H, T + 1, Dh), ``top`` and
    ``total`` (B, H, T + 1), each rescaled to the larger max."""
    at = _index(top, rows)
    old_top = top[at]                                                       # (B, H, G, Lq)
    new_top = torch.maximum(old_top, o_top)
    safe = _finite(new_top)
    a, c = torch.exp(old_top - safe), torch.exp(o_top - safe)
    acc[at] = acc[at] * a[..., None] + o * c[..., None]
    total[at] = total[at] * a + o_total * c
    top[at] = new_top


def _acc(x: Tensor) -> torch.dtype:
    """The dtype the softmax and the sums run in: float32, or float64 for float64 inputs."""
    return torch.promote_types(x.dtype, torch.float32)


def _finite(x: Tensor) -> Tensor:
    """x with -inf (a row that sees no key) as 0, so that exp(-inf - x) is 0, not nan."""
    return x.masked_fill(x == -math.inf, 0.0)


def _dropped(p: Tensor, dropout: float, seed: int) -> Tensor:
    """p with dropout: the mask a function of ``seed``, so the backward pass draws it again."""
    if dropout <= 0:
        return p
    g = torch.Generator(device=p.device).manual_seed(seed)
    return p * (torch.rand(p.shape, generator=g, device=p.device) >= dropout) / (1 - dropout)
