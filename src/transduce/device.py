"""Where tensors live and in what precision they compute: shared by training and inference."""

from __future__ import annotations

import contextlib

import torch

from .errors import ConfigError

PRECISIONS: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_device(name: str | torch.device, key: str = "device") -> torch.device:
    """"auto" -> CUDA if available else CPU; a ConfigError naming ``key`` for an unknown device
    or CUDA without a GPU."""
    if str(name) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"{key}: unknown device {name!r}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"{key}: {device} requested but CUDA is not available")
    return device


def check_precision(precision: str, key: str = "precision") -> None:
    if precision not in PRECISIONS:
        raise ConfigError(f"{key}: must be one of {', '.join(PRECISIONS)}; got {precision!r}")


def autocast_context(device: torch.device, precision: str, key: str = "precision",
                     cache: bool = True) -> contextlib.AbstractContextManager:
    """bf16 autocast on CPU and CUDA, fp16 on CUDA; fp32 runs without autocast. ``cache=False``
    recasts the weights at every use (what a CUDA graph capture needs)."""
    check_precision(precision, key)
    dtype = PRECISIONS[precision]
    if dtype is None:
        return contextlib.nullcontext()
    if precision == "fp16" and device.type != "cuda":
        raise ConfigError(f"{key}: fp16 needs CUDA; use bf16 on CPU")
    return torch.autocast(device_type=device.type, dtype=dtype, cache_enabled=cache)


def autocast_dtype(device: torch.device | str) -> torch.dtype | None:
    """The dtype autocast computes matmuls in on ``device``'s type right now, or None when off."""
    kind = torch.device(device).type
    available = getattr(torch.amp, "is_autocast_available", lambda k: k in ("cpu", "cuda"))
    if not available(kind):  # e.g. the meta device
        return None
    try:
        on = torch.is_autocast_enabled(kind)
    except TypeError:  # torch < 2.4 takes no device type
        on = torch.is_autocast_cpu_enabled() if kind == "cpu" else torch.is_autocast_enabled()
    if not on:
        return None
    if hasattr(torch, "get_autocast_dtype"):
        return torch.get_autocast_dtype(kind)
    return torch.get_autocast_cpu_dtype() if kind == "cpu" else torch.get_autocast_gpu_dtype()
