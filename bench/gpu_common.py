"""What the sections of bench/gpu.py share: the special ids of its random models, timing on a
device, and the guard that keeps one failing section or system from costing the rest of a run."""

from __future__ import annotations

import time
import traceback
from typing import Any, Callable

import torch

PAD, EOS = 0, 2  # the random models' padding and end-of-sentence ids


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], device: torch.device) -> float:
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def one_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}"


def guarded(fn: Callable, *args) -> Any:
    """``fn(*args)``, or {"error": ...} with the traceback's tail on stderr: one failing
    section or system must not cost the rest of a GPU run."""
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001
        traceback.print_exc(limit=4)
        return {"error": one_line(e)}
