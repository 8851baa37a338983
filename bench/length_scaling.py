"""Training cost as sentences grow: target tokens/s and peak memory from 16 to 1,024 tokens.

Every point trains on the same number of tokens per batch (``--budget``, default 4,096: 256
sentences of 16 tokens ... 4 of 1,024), so the matmul work per batch is fixed and what grows
is attention (quadratic in the length). Two attention paths side by side:

- ``sdpa``: ``F.scaled_dot_product_attention`` (what transduce trains with);
- ``math``: the explicit softmax(QK^T/sqrt(d_k))V that materialises every (T x T) weight
  matrix and keeps it for the backward pass (what attention maps use).

Each (length, path) point runs in a fresh process, so peak memory is that process's peak
resident set (CPU) or ``max_memory_allocated`` (CUDA) above the model's own, and one point's
garbage cannot inflate the next. Prints JSON.

Usage:
    python bench/length_scaling.py [--lengths 16,32,...,1024] [--budget 4096] [--steps 3] [--threads 2]
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
import time

SHAPE = dict(n_encoder_layers=3, n_decoder_layers=3, d_model=256, n_heads=4, d_ff=1024,
             src_vocab_size=8000, tgt_vocab_size=8000, dropout=0.1)


def rss_mb() -> float:
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def point(length: int, budget: int, steps: int, path: str, device: str) -> dict:
    """One measurement in this process: median tokens/s over ``steps`` after one warm-up step."""
    import torch

    import transduce.model.attention as attention
    from transduce.config import ModelConfig
    from transduce.data.batch import collate
    from transduce.model import Transformer
    from transduce.training.loss import label_smoothed_loss

    if path == "math":
        sdpa = attention.scaled_dot_product_attention
        attention.scaled_dot_product_attention = (
            lambda q, k, v, mask=None, dropout=0.0, is_causal=False, need_weights=False:
            (sdpa(q, k, v, mask, dropout, is_causal, need_weights=True)[0], None))
    torch.manual_seed(0)
    dev = torch.device(device)
    model = Transformer(ModelConfig(**SHAPE, max_positions=max(length + 8, 256))).to(dev).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, foreach=True)
    n = max(1, budget // length)
    g = torch.Generator().manual_seed(0)
    pairs = [(torch.randint(4, 8000, (length - 1,), generator=g).tolist(),
              torch.randint(4, 8000, (length - 1,), generator=g).tolist()) for _ in range(n)]
    batch = collate(pairs).to(dev)
    base = torch.cuda.memory_allocated(dev) / 2**20 if dev.type == "cuda" else rss_mb()

    def step() -> None:
        out = label_smoothed_loss(model(batch.src, batch.tgt_in), batch.tgt_out, 0.1, 0)
        (out.loss / out.n_tokens).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    times = []
    for i in range(steps + 1):
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        if i:
            times.append(time.perf_counter() - t0)
    if dev.type == "cuda":
        peak = torch.cuda.max_memory_allocated(dev) / 2**20
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    tokens = int((batch.tgt_out != 0).sum())
    return {"length": length, "sentences": n, "path": path,
            "tokens_per_s": round(tokens / statistics.median(times), 1),
            "peak_mb_above_model": round(peak - base, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="16,32,64,128,256,512,1024")
    ap.add_argument("--budget", type=int, default=4096, help="tokens per batch (each side)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--paths", default="sdpa,math")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--point", default=None, help=argparse.SUPPRESS)  # "LENGTH,PATH": run one point here
    args = ap.parse_args()

    import torch
    torch.set_num_threads(args.threads)
    if args.point:
        length, path = args.point.split(",")
        print(json.dumps(point(int(length), args.budget, args.steps, path, args.device)))
        return 0
    rows = []
    for length in (int(x) for x in args.lengths.split(",")):
        for path in args.paths.split(","):
            cmd = [sys.executable, __file__, "--point", f"{length},{path}", "--budget", str(args.budget),
                   "--steps", str(args.steps), "--threads", str(args.threads), "--device", args.device]
            out = subprocess.run(cmd, capture_output=True, text=True)
            if out.returncode:
                rows.append({"length": length, "path": path, "error": out.stderr.strip().splitlines()[-1:]})
            else:
                rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(json.dumps(rows[-1]), file=sys.stderr)
    print(json.dumps({
        "benchmark": "length_scaling", "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()}, {args.threads} threads, torch {torch.__version__}, {args.device}",
        "shape": SHAPE, "budget_tokens": args.budget, "steps": args.steps, "rows": rows,
    }, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
