"""bench/local_attention_kernel.py: the live tensors' peak it reports is the arithmetic of what a
pass allocates."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import local_attention_kernel as bench  # noqa: E402

MB = 2 ** 20


def _inputs(t):
    return tuple(torch.randn(1, 4, t, 64, requires_grad=True) for _ in range(3))  # 1 MB each at t = 1024


def test_tensor_peak_counts_what_a_pass_allocates():
    """q * k: the output and its gradient, then dq and dk, all alive at the end of the backward
    pass: 4 MB (v is unused). q * 2 made beside a 5 MB scratch tensor freed before the forward
    pass returns: 6 MB then, more than the output, its gradient and dq after it (3 MB)."""
    q, k, v = _inputs(1024)
    assert 4.0 <= bench.tensor_peak_mb(lambda q, k, v: q * k, q, k, v) <= 4.1

    def scratch(q, k, v):
        s = torch.ones(5 * MB // 4)                                         # float32: 5 MB
        out = q * 2.0
        del s
        return out

    q, k, v = _inputs(1024)
    assert 6.0 <= bench.tensor_peak_mb(scratch, q, k, v) <= 6.1
