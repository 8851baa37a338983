"""Optional packages in the tests (STYLE rule 25).

``python -m pytest`` must pass with only the README's install (``.[test,plot]``): a test that
needs a package of another extra skips, and its reason names the extra that installs it. CI's
second job installs every extra, so there nothing skips for want of a package.

    >>> transformers = need_extra("export", "transformers")           # at module level or in a test
    >>> onnx, ort = need_extra("export", "onnx", "onnxruntime")
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def need_extra(extra: str, *modules: str):
    """Import ``modules``, or skip the calling test (or test module) with a reason naming ``extra``.

    Returns:
        The module, or a tuple of the modules when several are named.
    """
    __tracebackhide__ = True  # pytest reports the skip at the caller's line
    reason = f"needs the {extra!r} extra: pip install 'transduce[{extra}]'"
    imported = []
    for m in modules:  # a loop, not a generator: its frame would be the reported location
        imported.append(pytest.importorskip(m, reason=f"{reason} ({m} is missing)"))
    return imported[0] if len(imported) == 1 else tuple(imported)


def multi30k_dir() -> Path:
    """Where Multi30k's raw files are: $TRANSDUCE_MULTI30K, else ../shared/data/multi30k beside
    the repository (never copied into it). It may not exist: callers skip then."""
    env = os.environ.get("TRANSDUCE_MULTI30K", "").strip()
    return Path(env) if env else (Path(__file__).resolve().parents[1] / "../shared/data/multi30k").resolve()


def free_ports(n: int) -> list[int]:
    """``n`` distinct loopback ports free now (for servers a test starts: Triton's HTTP and gRPC)."""
    import socket

    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports
