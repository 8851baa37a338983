"""Long-input attention kernels alone: forward + backward time, peak memory and the memory kept
for the backward pass.

One attention (B = 1, H = 4, Dh = 64, self-attention) at each length, side by side:

- ``full``: ``F.scaled_dot_product_attention`` over all keys (fused flash kernel on CPU);
- ``full_math``: the explicit softmax(QK^T/sqrt(d_k))V (stores T x T weights: the naive,
  materialised attention);
- ``local_5d``: the previous blocked local attention (commit 809143d): all blocks as one 5-D SDPA
  call over unfolded key windows, which only SDPA's math kernel takes (it keeps the W x 3W
  weights of every block);
- ``local``: :func:`transduce.model.local_attention.local_attention` as it is now (4-D, fused kernel);
- ``bigbird``: :func:`transduce.model.bigbird.bigbird_attention`, blocks of ``--block``, 3 window
  + 2 global + ``--random-blocks`` random blocks per query block (not causal: skipped with ``--causal``);
- ``lsh``: :func:`transduce.model.lsh.lsh_attention`, ``--hashes`` rounds into ``--buckets``
  buckets, chunks of ``--block``.

Each (length, path) point runs in a fresh process: "peak MB" is that process's peak resident set
above what it held once q, k and v existed (so one point's garbage cannot inflate the next);
"saved MB" is the size of the distinct storages autograd keeps for the backward pass (the
activation memory that grows with T), counted with ``saved_tensors_hooks``; "code MB" is how much
the process's file-backed resident pages grew meanwhile (library code run for the first time,
part of "peak MB"); with ``--tensor-peak``, "tensor peak MB" is the most bytes of tensors alive
at once in one more pass, beyond those alive before it, from torch.profiler's allocation records
(what the attention allocates, without the code, lazy imports and allocator slack that the
resident set also holds; the output's gradient and q, k, v's are counted); time is the median
of ``--repeats`` forward+backward passes after one warm-up (``--repeats 0``: one pass, peak
and saved memory only, no time: full SDPA at 16k takes minutes a pass). Prints JSON.

Usage:
    python bench/local_attention_kernel.py [--lengths 4096,16384] [--paths full,full_math,local,bigbird,lsh]
        [--window 256] [--block 64] [--random-blocks 3] [--hashes 2] [--buckets 32] [--causal]
        [--repeats 3] [--threads 1] [--skip-math-above 8192] [--timeout SECONDS] [--tensor-peak] [--dry]
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

from transduce.model.bigbird import bigbird_attention
from transduce.model.local_attention import local_attention
from transduce.model.lsh import LSHAttention, lsh_attention
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


def rss_mb() -> float:
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def file_rss_mb() -> float:
    """Resident pages backed by files (mostly shared libraries' code)."""
    with open("/proc/self/status", encoding="ascii") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssFile:")) / 1024


def tensor_peak_mb(fn, q, k, v) -> float:
    """The most bytes of tensors alive at once in one forward + backward pass, beyond those
    alive before it: the running sum of torch.profiler's allocation records (a free is negative)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn(q, k, v)
        out.backward(torch.ones_like(out))
        del out
    with tempfile.TemporaryDirectory() as tmp:
        prof.export_chrome_trace(f"{tmp}/trace.json")
        with open(f"{tmp}/trace.json", encoding="utf-8") as f:
            events = json.load(f)["traceEvents"]
    records = sorted((e for e in events if e.get("name") == "[memory]"), key=lambda e: e["ts"])  # stable
    alive = peak = 0
    for e in records:
        alive += e["args"]["Bytes"]
        peak = max(peak, alive)
    return round(peak / 2**20, 1)


def measure(fn, t: int, repeats: int, tensor_peak: bool) -> dict:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, t, 64, generator=g, requires_grad=True) for _ in range(3))
    base, base_file = rss_mb(), file_rss_mb()
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
        del out
        q.grad = k.grad = v.grad = None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    row = {"ms": round(1000 * statistics.median(times), 1) if times else None, "saved_mb": round(saved / 2**20, 1),
           "peak_mb": round(peak - base, 1), "code_mb": round(file_rss_mb() - base_file, 1)}
    if tensor_peak:
        row["tensor_peak_mb"] = tensor_peak_mb(fn, q, k, v)
    return row


def paths(args: argparse.Namespace) -> dict:
    """The attention functions by name, each (q, k, v) -> out."""
    w, c = args.window, args.causal
    lsh = LSHAttention(args.block, args.hashes, args.buckets, seed=0)
    return {"full": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=c),
            "full_math": lambda q, k, v: math(q, k, v, c),
            "local_5d": lambda q, k, v: local_5d(q, k, v, w, c),
            "local": lambda q, k, v: local_attention(q, k, v, None, w, 0, c),
            "bigbird": lambda q, k, v: bigbird_attention(q, k, v, None, args.block, args.random_blocks, seed=0),
            "lsh": lambda q, k, v: lsh_attention(q, k, v, None, lsh, c)}


def run_point(args: argparse.Namespace, t: int, name: str) -> dict:
    """One (length, path) point in a fresh process (its own peak memory)."""
    cmd = [sys.executable, __file__, "--point", f"{t},{name}"] + [a for a in sys.argv[1:] if a != "--dry"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"length": t, "path": name, "error": f"over --timeout {args.timeout} s"}
    if out.returncode:
        return {"length": t, "path": name, "error": out.stderr.strip().splitlines()[-1:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def ratios(rows: list[dict], peer: str) -> list[dict]:
    """Each path against ``peer`` at each length both reached: time and peak-memory ratios."""
    by = {(r["length"], r["path"]): r for r in rows if "error" not in r}
    return [{"length": t, "path": p, "peer": peer,
             "time": round(r["ms"] / by[t, peer]["ms"], 3) if r["ms"] and by[t, peer]["ms"] else None,
             "peak_memory": round(r["peak_mb"] / max(by[t, peer]["peak_mb"], 1.0), 3)}
            for (t, p), r in sorted(by.items()) if p != peer and (t, peer) in by]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="4096,16384")
    ap.add_argument("--paths", default="full,full_math,local,bigbird,lsh")
    ap.add_argument("--window", type=int, default=256, help="local attention's window W")
    ap.add_argument("--block", type=int, default=64, help="bigbird's block, lsh's chunk")
    ap.add_argument("--random-blocks", type=int, default=3)
    ap.add_argument("--hashes", type=int, default=2)
    ap.add_argument("--buckets", type=int, default=32)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--repeats", type=int, default=3, help="timed passes after a warm-up; 0: one pass, memory only")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--skip-math-above", type=int, default=8192)
    ap.add_argument("--timeout", type=float, default=None, help="seconds per point before it is given up")
    ap.add_argument("--tensor-peak", action="store_true",
                    help="one more pass under torch.profiler: the peak of live tensor bytes")
    ap.add_argument("--dry", action="store_true", help="tiny sizes (CI): lengths 256,512, one repeat")
    ap.add_argument("--point", default=None, help=argparse.SUPPRESS)  # "LENGTH,PATH": run one point here
    args = ap.parse_args()
    if args.dry:
        args.lengths, args.repeats, args.block, args.window = "256,512", 1, 32, 32
        sys.argv += ["--lengths", args.lengths, "--repeats", "1", "--block", "32", "--window", "32"]
    torch.set_num_threads(args.threads)
    if args.point:
        t, name = args.point.split(",")
        row = measure(paths(args)[name], int(t), args.repeats, args.tensor_peak)
        print(json.dumps({"length": int(t), "path": name, **row}))
        return 0
    rows = []
    for t in (int(x) for x in args.lengths.split(",")):
        for name in args.paths.split(","):
            if (name == "full_math" and t > args.skip_math_above) or (name == "bigbird" and args.causal):
                continue
            rows.append(run_point(args, t, name))
            print(json.dumps(rows[-1]), file=sys.stderr)
    print(json.dumps({"benchmark": "local_attention_kernel", "date": datetime.date.today().isoformat(),
                      "machine": f"{platform.machine()}, {args.threads} threads, torch {torch.__version__}",
                      "window": args.window, "block": args.block, "random_blocks": args.random_blocks,
                      "hashes": args.hashes, "buckets": args.buckets, "causal": args.causal,
                      "rows": rows, "ratios_vs_full": ratios(rows, "full"),
                      "ratios_vs_full_math": ratios(rows, "full_math")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
