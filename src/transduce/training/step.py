"""The pieces of one optimizer step, shared by the Trainer's eager/compiled step and the graphed
step (``training/cuda_graphs.py``): micro-batch forward/backward, the optimizer, clipping and the
non-finite skip. Nothing here reads a value back to the host: a GPU runs ahead of Python.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import torch
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel

from ..data.batch import Batch
from ..device import autocast_context
from ..errors import ConfigError
from ..tracing import LOSS, scope
from ..inference.search.common import AttentionChoice
from .encoder_tasks import classification_loss, masked_lm_loss, pretraining_loss
from .guided import guided_states
from .loss import LossOutput, excluded_class, projected_label_smoothed_loss
from .sharding import full_value, is_sharded, is_sharded_tensor, set_gradient_sync


def unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The model inside DDP and ``torch.compile`` wrappers."""
    model = getattr(model, "_orig_mod", model)
    return getattr(model, "module", model)


def final_states(model: torch.nn.Module, batch: Batch) -> Tensor:
    """The states before the output projection (B, T, D) for ``batch``'s labels: the
    encoder-decoder reads source and target input, a decoder-only LM only the target input, an
    encoder-only model only the (masked) source (see
    :func:`~transduce.data.encoder_inputs.masked_batch`) and, with token types, their segments (a
    sentence pair's second is type 1)."""
    cfg = unwrapped(model).config
    return cfg.family.states(model, batch, cfg)


def batch_loss(model: torch.nn.Module, hidden: Tensor, batch: Batch, smoothing: float, pad_id: int) -> LossOutput:
    """The summed loss of ``batch``'s labels from the :func:`final_states` ``hidden``: the output
    projection fused with the loss; for a masked LM its head on the selected positions only; for a
    classifier its pooled head against the (B, 1) labels of a classification batch; with
    next-sentence labels also the next-sentence head."""
    with scope(LOSS):
        return _batch_loss(unwrapped(model), hidden, batch, smoothing, pad_id)


def _batch_loss(inner: torch.nn.Module, hidden: Tensor, batch: Batch, smoothing: float, pad_id: int) -> LossOutput:
    if not inner.config.family.masked_lm:
        return projected_label_smoothed_loss(hidden, inner.output_proj.weight, batch.tgt_out, smoothing, pad_id,
                                             bias=inner.output_proj.bias, excluded=excluded_class(inner.config))
    if inner.config.n_classes:
        return classification_loss(inner.classify(hidden), batch.tgt_out[:, 0], smoothing)
    if batch.next_labels is not None:
        return pretraining_loss(inner, hidden, batch.tgt_out, batch.next_labels, smoothing)
    return masked_lm_loss(inner, hidden, batch.tgt_out, smoothing)


def forward_backward(model: torch.nn.Module, batches: list[Batch], smoothing: float, pad_id: int,
                     normalizer: float | Tensor, precision: str, device: torch.device,
                     scaler: torch.amp.GradScaler | None = None, autocast_cache: bool = True,
                     guided: tuple[float, AttentionChoice] | None = None) -> Tensor:
    """Accumulate gradients of sum(loss) / normalizer over micro-batches.

    ``normalizer`` is the target-token count of the whole step divided by the world size, so
    that after DDP averages gradients across ranks they equal those of one process that saw
    the whole step's batches (the loss is per target token, as in the paper's batches). The
    output projection and the loss are fused (the (B, T, V) logits are never stored), under
    autocast for bf16/fp16. With ``guided`` (weight, head) and batches that carry alignment
    references, the guided alignment loss of that head is added, times the weight, to what is
    differentiated (not to the returned sums: they stay comparable with the validation loss).

    Returns:
        A (2,) float32 tensor on the device: the summed smoothed loss and summed NLL of these
        batches (their token count is ``sum(b.n_tgt_tokens)``, known on the host).
    """
    sums = torch.zeros(2, device=device)
    for i, batch in enumerate(batches):
        with gradient_sync(model, i == len(batches) - 1):
            with autocast_context(device, precision, "train.precision", cache=autocast_cache):
                if guided is not None and batch.alignment is not None:
                    hidden, align = guided_states(model, batch.src, batch.tgt_in, batch.alignment, guided[1])
                else:
                    hidden, align = final_states(model, batch), None              # (B, T, D)
                out = batch_loss(model, hidden, batch, smoothing, pad_id)
            scaled = (out.loss if align is None else out.loss + guided[0] * align) / normalizer
            (scaler.scale(scaled) if scaler is not None else scaled).backward()
        sums += torch.stack([out.loss.detach(), out.nll]).float()
    tie_duplicate_rows(unwrapped(model))
    return sums


VOCAB_ROWS = ("src_embed.tokens.weight", "tgt_embed.tokens.weight", "output_proj.weight")  # (V, D) matrices


def tie_duplicate_rows(model: torch.nn.Module) -> None:
    """An imported T5's BOS is PAD's row again (``model.bos_in_softmax`` false): T5 has one row
    that is both its decoder start and an output class. Give both of our rows the sum of their
    gradients, so that they stay one row trained as T5 trains it (its export writes one of them).
    Under train.fsdp a gradient is sharded by rows: the rank that holds both rows adds them."""
    cfg = model.config
    if getattr(cfg, "bos_in_softmax", True):
        return
    for name, p in model.named_parameters():
        if p.grad is None or name not in VOCAB_ROWS:
            continue
        g, pad, bos = p.grad, cfg.pad_id, cfg.bos_id
        if is_sharded_tensor(g):  # dim 0 in chunks of ceil(V / ranks), as torch.chunk
            start = g.device_mesh.get_local_rank() * -(-g.shape[0] // g.device_mesh.size())
            g, pad, bos = g.to_local(), pad - start, bos - start
            if not (0 <= pad < g.shape[0] and 0 <= bos < g.shape[0]):
                continue
        both = g[pad] + g[bos]
        g[pad].copy_(both)
        g[bos].copy_(both)


def gradient_sync(model: torch.nn.Module, last: bool) -> contextlib.AbstractContextManager:
    """A block whose backward synchronises gradients across ranks only on a step's ``last``
    micro-batch: DDP's ``no_sync`` on the others, FSDP's gradient sync switched off for them."""
    if is_sharded(model):
        set_gradient_sync(model, last)
        return contextlib.nullcontext()
    return contextlib.nullcontext() if last or not isinstance(model, DistributedDataParallel) else model.no_sync()


def freeze_parameters(model: torch.nn.Module, prefixes: tuple[str, ...]) -> None:
    """Stop training the parameters whose names start with one of ``prefixes`` (``train.freeze``);
    a prefix that names no parameter is a one-line error listing the top-level names."""
    names = [n for n, _ in model.named_parameters()]
    for prefix in prefixes:
        if not any(n.startswith(prefix) for n in names):
            tops = ", ".join(sorted({n.split(".")[0] + "." for n in names}))
            raise ConfigError(f"train.freeze: {prefix!r} names no parameter of this model (its names start "
                              f"with {tops})")
    for name, p in model.named_parameters():
        if name.startswith(tuple(prefixes)):
            p.requires_grad_(False)


# torch's fused Adam/AdamW kernel for CPU tensors arrived in 2.4 (the package allows 2.3)
FUSED_CPU = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 4)
HEAD_PREFIXES = ("cls_head.", "mlm_head.", "nsp_head.", "output_proj.")  # what train.head_lr trains


def build_optimizer(model: torch.nn.Module, cfg, lr: float | Tensor = 0.0) -> torch.optim.Optimizer:
    """Adam(beta1=0.9, beta2=0.98, eps=1e-9) as Sec. 5.3; AdamW decays only matrices; T5's Adafactor.

    Fused (one kernel for all parameters, and able to skip a step on the device, see
    :func:`clip_and_step`) wherever torch has the kernel: CUDA, and the CPU from torch 2.4 (2-3x
    faster than ``foreach`` there, the same update within float rounding; Hugging Face's Trainer
    defaults to it too); ``foreach`` on older torch and other devices. ``lr`` may be a 0-dim
    device tensor (the graphed step changes it in place); ``capturable`` (which a CUDA graph
    capture of ``step()`` requires) with ``cfg.cuda_graphs``. Frozen parameters (``requires_grad``
    off, ``train.freeze``) are left out. With ``cfg.head_lr`` the heads' parameters get groups of
    their own whose ``lr_ratio`` (head_lr / lr) the loop multiplies the scheduled rate by.
    """
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    params = [p for _, p in named]
    fused = cfg.cuda_graphs or all(p.is_cuda or (p.device.type == "cpu" and FUSED_CPU) for p in params)
    kwargs: dict[str, Any] = dict(lr=lr, betas=tuple(cfg.betas), eps=cfg.eps, fused=fused,
                                  foreach=None if fused else True, capturable=cfg.cuda_graphs)
    parts = [(params, 1.0)]
    if cfg.head_lr is not None:
        parts = [([p for n, p in named if n.startswith(HEAD_PREFIXES) == head], ratio)
                 for head, ratio in ((False, 1.0), (True, cfg.head_lr / cfg.lr))]
    if cfg.optimizer == "adamw":
        groups = [{"params": [p for p in part if (p.dim() >= 2) == decay], "lr_ratio": ratio,
                   "weight_decay": cfg.weight_decay if decay else 0.0}
                  for part, ratio in parts for decay in (True, False)]
        return torch.optim.AdamW(_ratioed(groups, cfg), **kwargs)
    groups = _ratioed([{"params": part, "lr_ratio": ratio} for part, ratio in parts], cfg)
    if cfg.optimizer == "adafactor":
        if not hasattr(torch.optim, "Adafactor"):
            raise ConfigError(f"train.optimizer: adafactor needs torch >= 2.5 (this is {torch.__version__})")
        return torch.optim.Adafactor(groups, lr=lr, weight_decay=cfg.weight_decay, foreach=True)
    return torch.optim.Adam(groups, weight_decay=cfg.weight_decay, **kwargs)


def _ratioed(groups: list[dict], cfg) -> list[dict]:
    """The groups as before ``train.head_lr`` (no ``lr_ratio`` key, so older optimizer states
    load) unless it is set; then the non-empty ones."""
    if cfg.head_lr is None:
        return [{k: v for k, v in g.items() if k != "lr_ratio"} for g in groups]
    return [g for g in groups if g["params"]]


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """``optimizer.load_state_dict(state)``, keeping how this optimizer steps.

    A state dict carries the saved run's implementation flags (fused, foreach, capturable), a
    choice of its device; a run resumed elsewhere (a CPU checkpoint on a GPU) must keep its own,
    with the step counters on the parameters' device where a fused or capturable step wants them.
    """
    flags = [{k: g.get(k) for k in ("fused", "foreach", "capturable")} for g in optimizer.param_groups]
    optimizer.load_state_dict(state)
    for group, own in zip(optimizer.param_groups, flags):
        group.update(own)
        for p in group["params"]:
            saved = optimizer.state.get(p, {})
            if "step" in saved and (own["fused"] or own["capturable"]):
                saved["step"] = torch.as_tensor(saved["step"], dtype=torch.float32).to(p.device)


def is_fused(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer`` is a fused Adam/AdamW (which takes ``found_inf`` to skip a step)."""
    return bool(optimizer.defaults.get("fused"))


def clip_and_step(optimizer: torch.optim.Optimizer, params: list[Tensor], loss_sum: Tensor,
                  clip_norm: float | None, found_inf: Tensor) -> tuple[Tensor, Tensor]:
    """Clip gradients to ``clip_norm`` and step, unless the loss or the gradient norm is non-finite.

    The decision stays on the device: a fused optimizer skips its update (and its step count)
    where ``found_inf`` is 1, as it does for a GradScaler. ``found_inf`` is a 0-dim float32
    device tensor written here (a fixed buffer, so a CUDA graph can capture this).

    Returns:
        The gradient norm before clipping and whether the step was applied (0-dim device tensors).
    """
    norm = full_value(torch.nn.utils.clip_grad_norm_(params, clip_norm or math.inf, foreach=True))
    ok = torch.isfinite(loss_sum) & torch.isfinite(norm)
    found_inf.copy_(~ok)
    optimizer.found_inf = found_inf
    optimizer.step()
    return norm, ok


def compile_model(model: torch.nn.Module, backend: Any = "inductor") -> torch.nn.Module:
    """``torch.compile`` with dynamic batch shapes: compiled once for every (B, S, T), not once per
    shape (which would make a run of varying batches slower than eager). Sizes 0 and 1 are still
    specialised by the compiler, so a batch of one row compiles once more."""
    return torch.compile(model, backend=backend, dynamic=True)
