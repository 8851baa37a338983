"""Local attention's kernel alone: forward + backward time and memory kept for the backward pass.

One attention (B = 1, H = 4, Dh = 64, self-attention) at each length, side by side in one process:

- ``full``: ``F.scaled_dot_product_attention`` over all keys (fused flash kernel on CPU);
- ``full_math``: the explicit softmax(QK^T/sqrt(d_k))V (stores T x T weights);
- ``local_5d``: the previous blocked local attention (commit 809143d): all blocks as one 5-D SDPA
  call over unfolded key windows, which only SDPA's math kernel takes (it keeps the W x 3W
  weights of every block);
- ``local``: :func:`transduce.model.local_attention.local_attention` as it is now (4-D, fused kernel).

"saved MB" is the size of the distinct storages autograd keeps for the backward pass (the
activation memory that grows with T), counted with ``saved_tensors_hooks``; time is the median
of ``--repeats`` forward+backward passes after one warm-up. Prints JSON.

Usage:
    python bench/local_attention_kernel.py [--lengths 4096,16384] [--window 256] [--causal]
        [--repeats 3] [--threads 1] [--skip-math-above 8192]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from transduce.model.local_attention import local_attention
from transduce.model.masks import local_mask


def local_5d(q, k, v, window, causal):
    """The 5-D batched band of commit 809143d (no globals, no padding, start 0)."""
    b, h, t, dh = q.shape
    w = window
    nb, span = -(-t // w), (2 if causal else 3) * w
    first, last = -w, -w + (nb - 1) * w + span - 1
    pad = (w, max(0, last + 1 - t))

    def windows(x):
        x = F.pad(x[..., :last + 1, :], (0, 0) + pad)
        return x.unfold(-2, span, w).transpose(-1, -2)

    q_pos = torch.arange(nb * w).view(nb, w)
    k_pos = first + torch.arange(nb)[:, None] * w + torch.arange(span)
    m = local_mask(q_pos, k_pos, w, 0, causal) & ((k_pos >= 0) & (k_pos < t))[:, None, :]
    qb = F.pad(q, (0, 0, 0, nb * w - t)).view(b, h, nb, w, dh)
    out = F.scaled_dot_product_attention(qb, windows(k), windows(v), attn_mask=m)
    return out.reshape(b, h, nb * w, dh)[:, :, :t]


def math(q, k, v, causal):
    s = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v


def measure(fn, t: int, repeats: int) -> dict:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, t, 64, generator=g, requires_grad=True) for _ in range(3))
    times, saved = [], 0
    for i in range(repeats + 1):
        storages: dict[int, int] = {}

        def pack(x):
            storages[x.untyped_storage().data_ptr()] = x.untyped_storage().nbytes()
            return x

        t0 = time.perf_counter()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
            out = fn(q, k, v)
        out.backward(torch.ones_like(out))
        if i:
            times.append(time.perf_counter() - t0)
        saved = sum(n for p, n in storages.items() if p not in {x.untyped_storage().data_ptr() for x in (q, k, v)})
        q.grad = k.grad = v.grad = None
    return {"ms": round(1000 * statistics.median(times), 1), "saved_mb": round(saved / 2**20, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="4096,16384")
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--skip-math-above", type=int, default=8192)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    w, c = args.window, args.causal
    paths = {"full": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=c),
             "full_math": lambda q, k, v: math(q, k, v, c),
             "local_5d": lambda q, k, v: local_5d(q, k, v, w, c),
             "local": lambda q, k, v: local_attention(q, k, v, None, w, 0, c)}
    rows = []
    for t in (int(x) for x in args.lengths.split(",")):
        for name, fn in paths.items():
            if name == "full_math" and t > args.skip_math_above:
                continue
            rows.append({"length": t, "path": name, **measure(fn, t, args.repeats)})
            print(json.dumps(rows[-1]), file=sys.stderr)
    print(json.dumps({"benchmark": "local_attention_kernel", "window": w, "causal": c, "threads": args.threads,
                      "torch": torch.__version__, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
