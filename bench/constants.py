"""Microbenchmarks behind code constants (BENCHMARKS.md, "Figures behind code constants").

Each section times one operation at the constant's value and at its alternatives: the median of
``--repeats`` calls after one warm-up call, in milliseconds.

- ``score_rows``: ``best_tokens`` (search/common.py) over 1,250 rows x an 8k vocabulary, top 8,
  with ``SCORE_ROWS`` 32 / 64 / 128 / 256 and all rows at once;
- ``pack_rows``: ``OneDNNLinear`` 256 -> 8,000 (speed/cpu.py) at 64 and 256 rows, its weight packed
  once for ``PACK_ROWS`` (64), packed for 1 row, repacked every call, and ``F.linear``;
- ``loss_chunk``: ``projected_label_smoothed_loss`` (training/loss.py) forward + backward of 3,840 x
  128 states over 8k classes in blocks of 128 ... 4,096 rows (the CPU default 256), and unfused;
- ``step_scores``: bigbird and lsh attention forward + backward at 4k tokens (B 1, H 4, Dh 64), steps
  of 2^15 ... 2^18 scores (``STEP_SCORES`` 2^16, model/gathered_attention.py).

Usage:
    python bench/constants.py [--sections score_rows,pack_rows,loss_chunk,step_scores] [--threads 1]
        [--repeats 5] [--dry]      # --dry: small shapes, one repeat (checks that it runs)
Prints JSON: {"threads": N, section: {variant: ms}}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from types import SimpleNamespace

import torch
import torch.nn.functional as F

import transduce.inference.search.common as common
import transduce.inference.speed.cpu as cpu
from transduce.model.bigbird import bigbird_attention
from transduce.model.lsh import LSHAttention, lsh_attention
from transduce.training.loss import label_smoothed_loss, projected_label_smoothed_loss


def ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return round(statistics.median(times), 3)


def score_rows(n: int, vocab: int, repeats: int) -> dict:
    model = SimpleNamespace(output_proj=torch.nn.Linear(256, vocab))
    config, states, out = SimpleNamespace(pad_id=0, bos_id=1, eos_id=2), torch.randn(n, 256), {}
    for rows in (32, 64, 128, 256, n):
        common.SCORE_ROWS = rows
        with torch.inference_mode():
            out["all" if rows == n else rows] = ms(lambda: common.best_tokens(model, states, config, 5, 0, 8), repeats)
    return out


def pack_rows(vocab: int, repeats: int) -> dict:
    layer, out = cpu.OneDNNLinear(256, vocab).eval(), {}
    for rows in (64, 256):
        x = torch.randn(rows, 256)
        with torch.no_grad():
            out[f"{rows} rows, F.linear"] = ms(lambda: F.linear(x, layer.weight, layer.bias), repeats)
            for pack in (cpu.PACK_ROWS, 1):
                cpu.PACK_ROWS, saved = pack, cpu.PACK_ROWS
                layer.__dict__.pop("_packed", None)
                out[f"{rows} rows, packed for {pack}"] = ms(lambda: layer(x), repeats)
                cpu.PACK_ROWS = saved
            out[f"{rows} rows, repacked"] = ms(lambda: (layer.__dict__.pop("_packed", None), layer(x)), repeats)
    return out


def loss_chunk(rows: int, vocab: int, repeats: int) -> dict:
    hidden = torch.randn(rows // 128, 128, 128, requires_grad=True)                  # (B, T, D)
    weight = torch.randn(vocab, 128, requires_grad=True)                              # (V, D)
    target = torch.randint(3, vocab, (rows // 128, 128))
    out = {c: ms(lambda: projected_label_smoothed_loss(hidden, weight, target, 0.1, 0, chunk=c).loss.backward(),
                 repeats) for c in (128, 256, 512, 1024, 4096)}
    out["unfused"] = ms(lambda: label_smoothed_loss(F.linear(hidden, weight), target, 0.1, 0).loss.backward(), repeats)
    return out


def step_scores(t: int, repeats: int) -> dict:
    q, k, v = (torch.randn(1, 4, t, 64, requires_grad=True) for _ in range(3))
    kernels = {"bigbird": lambda s: bigbird_attention(q, k, v, None, 64, 3, 0, step_scores=s),
               "lsh": lambda s: lsh_attention(q, k, v, None, LSHAttention(64, 2, 32, 0), step_scores=s)}
    return {f"{name} 2^{p}": ms(lambda: run(2 ** p).sum().backward(), repeats)
            for name, run in kernels.items() for p in (15, 16, 17, 18)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sections", default="score_rows,pack_rows,loss_chunk,step_scores")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dry", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    vocab, r = (1000, 1) if args.dry else (8000, args.repeats)
    runs = {"score_rows": lambda: score_rows(300 if args.dry else 1250, vocab, r),
            "pack_rows": lambda: pack_rows(vocab, r),
            "loss_chunk": lambda: loss_chunk(512 if args.dry else 3840, vocab, r),
            "step_scores": lambda: step_scores(512 if args.dry else 4096, r)}
    result = {"threads": args.threads, "dry": args.dry}
    result.update({name: runs[name]() for name in args.sections.split(",")})
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
