"""Fully sharded data parallel training (``train.fsdp``): PyTorch's FSDP2 (``fully_shard``).

Each rank keeps 1/world of every parameter, gradient and optimizer state; a layer's parameters
are gathered just before its forward and backward and dropped after them, the gradients
reduce-scattered (the usual pattern: each encoder and decoder layer sharded, then the root,
which holds the embeddings, the final norms and the output projection). The training step is
DDP's: the same loss normaliser, gradients synchronised on the last micro-batch only.

Checkpoints stay what they are without it: the full ``model.safetensors`` and a ``trainer.pt``
whose optimizer state is torch.optim's own (indexed, unsharded) one, gathered from every rank
and written by rank 0, so a run saved under FSDP resumes under DDP, in one process or under
FSDP on another world size, and every other command reads its models unchanged.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch import Tensor

from ..model.io import build_model, check_state

# torch.distributed.fsdp, .tensor and .checkpoint take seconds to import: they are imported where
# a model is sharded, and until then nothing can be a DTensor or a sharded module.


def is_sharded_tensor(t: Any) -> bool:
    """Whether ``t`` is a DTensor (a sharded parameter, its gradient, a norm over them)."""
    tensor = sys.modules.get("torch.distributed.tensor")
    return tensor is not None and isinstance(t, tensor.DTensor)


def shard_model(model: torch.nn.Module, precision: str) -> None:
    """Shard ``model`` in place across the default process group: each encoder and decoder layer
    a unit of its own, then the root. With ``bf16`` the gathered parameters and the computation
    are bfloat16 and gradients are reduced in float32 (the sharded parameters stay float32)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if precision == "bf16" else MixedPrecisionPolicy()
    for name in ("encoder_layers", "decoder_layers"):
        for layer in getattr(model, name, None) or ():
            fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether ``model`` (or the model inside a ``torch.compile`` wrapper) is FSDP-sharded."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    return fsdp is not None and isinstance(getattr(model, "_orig_mod", model), fsdp.FSDPModule)


def set_gradient_sync(model: torch.nn.Module, sync: bool) -> None:
    """Whether the next backward reduce-scatters the gradients (FSDP's ``no_sync``: off on all
    but a step's last micro-batch, the gradients accumulate unsharded until then)."""
    getattr(model, "_orig_mod", model).set_requires_gradient_sync(sync)


def full_value(t: Tensor) -> Tensor:
    """``t`` as a plain tensor: a replicated DTensor (the gradient norm of sharded gradients)
    gathered, anything else as it is."""
    return t.full_tensor() if is_sharded_tensor(t) else t


def full_model(model: torch.nn.Module, everywhere: bool = False) -> torch.nn.Module | None:
    """An unsharded copy of a sharded ``model`` (its config's class, eval mode), built from the
    gathered weights. Every rank must call it; with ``everywhere`` every rank gets the copy, on
    the model's device (to validate, as every DDP rank validates its replica); otherwise rank 0
    gets it on the CPU (to save) and the others None."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=not everywhere)
    state = get_model_state_dict(model, options=options)
    if not state:
        return None
    device = next(iter(state.values())).device
    with torch.random.fork_rng(devices=[]):  # its initial weights, overwritten, must not move the dropout stream
        copy = build_model(model.config).to(device)
    copy.load_state_dict(state, strict=False)  # tied names are one tensor: either loads it
    return copy.eval()


def load_full_state(model: torch.nn.Module, state: dict[str, Tensor], source: str) -> None:
    """Load a full (unsharded) weights file's ``state`` into a sharded ``model``, checked as
    :func:`~transduce.model.io.load_state_checked` checks it; every rank holds ``state``."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    tied = {n for n, _ in model.named_parameters(remove_duplicate=False)}
    expected = {n: tuple(p.shape) for n, p in model.named_parameters()}  # global shapes; tied once
    expected |= {n: tuple(t.shape) for n, t in model.state_dict().items() if n not in tied}  # buffers
    check_state(expected, state, source)
    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True, strict=False))


def sharded_like(full: Tensor, like: Tensor) -> Tensor:
    """``full`` sharded as ``like`` is, when ``like`` is a DTensor: this rank's part of it (every
    rank holds ``full``, so nothing is sent); ``full`` itself otherwise."""
    if not is_sharded_tensor(like):
        return full
    from torch.distributed.tensor import distribute_tensor

    full = full.to(device=like.device, dtype=like.dtype)
    return distribute_tensor(full, like.device_mesh, like.placements, src_data_rank=None)


def full_optimizer_state(optimizer: torch.optim.Optimizer, keep: bool) -> dict[str, Any] | None:
    """``optimizer.state_dict()`` with every sharded state tensor gathered whole, on the CPU:
    torch.optim's own indexed format, as an unsharded run saves it (torch's distributed
    ``get_optimizer_state_dict`` keys it by parameter name instead). Every rank must call it;
    the ranks with ``keep`` get it, the others None."""
    saved = optimizer.state_dict()
    state = {}
    for index, per_param in saved["state"].items():  # a new dict: the optimizer's own are in there
        state[index] = {k: full_value(v).cpu() if is_sharded_tensor(v) else v for k, v in per_param.items()}
    return {**saved, "state": state} if keep else None


def shard_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """After ``optimizer.load_state_dict`` of a full state: each sharded parameter's state
    tensors cut to this rank's part (loading casts them to the parameter's device, not its
    sharding)."""
    for p, per_param in optimizer.state.items():
        for k, v in per_param.items():
            if is_sharded_tensor(p) and isinstance(v, Tensor) and not is_sharded_tensor(v) \
                    and v.shape == p.shape:
                per_param[k] = sharded_like(v, p)
