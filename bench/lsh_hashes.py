"""LSH attention's quality against its rounds of hashing: validation perplexity of the LM demo
(``transduce demo --task lm``: a small GPT on the toy German sentences) with full attention and
with ``model.attention=lsh`` at 1, 2, 4... rounds, the same steps and seed each.

The toy sentences are short (tens of tokens), so the buckets and chunks are made small to match
(``--buckets``, ``--chunk``): with few tokens a bucket, a query sees little of its prefix in one
round, and more rounds let it see more. Each variant trains in its own process, ``--parallel`` at
a time, one thread each. Prints JSON: val_ppl and seconds per variant, the ratio to full.

Usage:
    python bench/lsh_hashes.py [--hashes 1,2,4] [--buckets 4] [--chunk 8] [--steps 400]
        [--parallel 2] [--out runs/lsh_hashes] [--dry]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import multiprocessing
import platform
import sys
import time
from pathlib import Path


def train_variant(args: tuple[str, dict, int, str]) -> dict:
    """Train the LM demo with ``model`` changes in ``out/name`` -> its validation perplexity."""
    name, model, steps, out = args
    import torch

    from transduce.demo import demo_config
    from transduce.training.loop import run_training

    torch.manual_seed(0)
    cfg = demo_config(steps, task="lm")
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, **model),
                              train=dataclasses.replace(cfg.train, threads=1))
    t0 = time.monotonic()
    _, metrics = run_training(cfg, Path(out) / name)
    return {"variant": name, **model, "val_ppl": round(metrics["val_ppl"], 3),
            "seconds": round(time.monotonic() - t0, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hashes", default="1,2,4")
    ap.add_argument("--buckets", type=int, default=4)
    ap.add_argument("--chunk", type=int, default=8)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--out", default="runs/lsh_hashes")
    ap.add_argument("--dry", action="store_true", help="20 steps, hashes 1,2 (CI)")
    args = ap.parse_args()
    if args.dry:
        args.steps, args.hashes = 20, "1,2"
    variants = [("full", {})] + [(f"lsh_{n}", dict(attention=dict(kind="lsh", lsh_hashes=n, lsh_buckets=args.buckets,
                                                                  block=args.chunk)))
                                 for n in (int(x) for x in args.hashes.split(","))]
    jobs = [(name, model, args.steps, args.out) for name, model in variants]
    with multiprocessing.get_context("spawn").Pool(args.parallel) as pool:
        rows = pool.map(train_variant, jobs)
    full = rows[0]["val_ppl"]
    for r in rows:
        r["ppl_vs_full"] = round(r["val_ppl"] / full, 3)
    print(json.dumps({"benchmark": "lsh_hashes", "date": datetime.date.today().isoformat(),
                      "machine": f"{platform.machine()}, 1 thread a variant, {args.parallel} at a time",
                      "steps": args.steps, "buckets": args.buckets, "chunk": args.chunk, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
