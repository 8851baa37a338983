"""Training cost as sentences grow: target tokens/s and peak memory from 16 to 16,384 tokens.

Every point trains on the same number of tokens per batch (``--budget``, default 4,096: 256
sentences of 16 tokens ... 4 of 1,024, then one sentence of the length), so up to 4,096 tokens
the matmul work per batch is fixed and what grows is attention. Attention paths side by side:

- ``sdpa``: full attention through ``F.scaled_dot_product_attention`` (what transduce trains with);
- ``math``: the explicit softmax(QK^T/sqrt(d_k))V that materialises every (T x T) weight
  matrix and keeps it for the backward pass (what attention maps use);
- ``local``: ``model.attention=local`` and ``model.cross_attention=local``, window ``--window``
  (blocked: O(T * W));
- ``linformer``: ``model.attention=linformer`` (encoder self-attention, k = ``--linformer-k``);
  the decoder's self- and cross-attention stay full;
- ``bigbird``: ``model.attention=bigbird`` (encoder self-attention, blocks of 64, 3 random
  blocks); the decoder's attention stays full;
- ``lsh``: ``model.attention=lsh`` (encoder and decoder self-attention, 2 rounds, 32 buckets,
  chunks of 64); cross-attention stays full.

Each (length, path) point runs in a fresh process, so peak memory is that process's peak
resident set (CPU) or ``max_memory_allocated`` (CUDA) above the model's own, and one point's
garbage cannot inflate the next. ``--rounds`` repeats the sweep, the paths interleaved within
each length, and reports medians (for a shared machine). Prints JSON; ``--plot PATH.png`` draws
tokens/s and peak memory against length.

Usage:
    python bench/length_scaling.py [--lengths 16,32,...,16384] [--paths sdpa,local,linformer,bigbird,lsh]
        [--budget 4096] [--steps 3] [--rounds 1] [--threads 2] [--window 256] [--linformer-k 256]
        [--warmup 1] [--timeout SECONDS] [--plot length_scaling.png] [--merge EARLIER.json ...]

``--merge`` adds the rows of earlier runs (e.g. the longest lengths, run with ``--warmup 0``
because one step there takes minutes) to this run's table, ratios and plot.
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


def attention_options(path: str, window: int, linformer_k: int) -> dict:
    """The ModelConfig keys of one attention path."""
    if path == "local":
        return dict(attention=dict(kind="local", cross="local", window=window))
    if path == "linformer":
        return dict(attention=dict(kind="linformer", linformer_k=linformer_k))
    if path in ("bigbird", "lsh"):
        return dict(attention=dict(kind=path, block=64))
    return {}


def point(length: int, budget: int, steps: int, path: str, device: str, window: int = 256,
          linformer_k: int = 256, warmup: int = 1) -> dict:
    """One measurement in this process: median tokens/s over ``steps`` after ``warmup`` steps."""
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
    cfg = ModelConfig(**SHAPE, max_positions=max(length + 8, 256, linformer_k),
                      **attention_options(path, window, linformer_k))
    model = Transformer(cfg).to(dev).train()
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
    for i in range(steps + warmup):
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    if dev.type == "cuda":
        peak = torch.cuda.max_memory_allocated(dev) / 2**20
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    tokens = int((batch.tgt_out != 0).sum())
    return {"length": length, "sentences": n, "path": path,
            "tokens_per_s": round(tokens / statistics.median(times), 1),
            "peak_mb_above_model": round(peak - base, 1)}


def _run_point(args: argparse.Namespace, length: int, path: str) -> dict:
    cmd = [sys.executable, __file__, "--point", f"{length},{path}", "--budget", str(args.budget),
           "--steps", str(args.steps), "--threads", str(args.threads), "--device", args.device,
           "--window", str(args.window), "--linformer-k", str(args.linformer_k), "--warmup", str(args.warmup)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"length": length, "path": path, "error": f"over --timeout {args.timeout} s"}
    if out.returncode:
        return {"length": length, "path": path, "error": out.stderr.strip().splitlines()[-1:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def medians(runs: list[dict]) -> dict:
    """One row per (length, path): median tokens/s and peak over the rounds that finished."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return runs[-1]
    return {**ok[0], "rounds": len(ok),
            "tokens_per_s": round(statistics.median(r["tokens_per_s"] for r in ok), 1),
            "peak_mb_above_model": round(statistics.median(r["peak_mb_above_model"] for r in ok), 1)}


def ratios(rows: list[dict], path: str, peer: str = "sdpa") -> list[dict]:
    """``path`` against ``peer`` at each length both reached: tokens/s and peak-memory ratios."""
    by = {(r["length"], r["path"]): r for r in rows if "error" not in r}
    out = []
    for (length, p), r in sorted(by.items()):
        q = by.get((length, peer))
        if p == path and q:
            out.append({"length": length, "path": path, "speedup": round(r["tokens_per_s"] / q["tokens_per_s"], 2),
                        "memory_ratio": round(r["peak_mb_above_model"] / max(q["peak_mb_above_model"], 1.0), 3)})
    return out


def plot(rows: list[dict], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from transduce.atomic import atomic_path

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name in dict.fromkeys(r["path"] for r in rows):
        pts = sorted((r["length"], r["tokens_per_s"], r["peak_mb_above_model"]) for r in rows
                     if r["path"] == name and "error" not in r)
        if pts:
            x, tps, mb = zip(*pts)
            label = {"sdpa": "full (SDPA)", "math": "full (explicit softmax)"}.get(name, name)
            ax1.plot(x, tps, marker="o", label=label)
            ax2.plot(x, mb, marker="o", label=label)
    for ax, ylabel in ((ax1, "target tokens/s (training)"), (ax2, "peak memory above the model (MB)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sentence length (tokens)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    ax2.set_yscale("log")
    fig.suptitle("transduce training cost against length, by attention")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=100, format="png")
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="16,32,64,128,256,512,1024,2048,4096,8192,16384")
    ap.add_argument("--budget", type=int, default=4096, help="tokens per batch (each side)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps first (0: the first step is timed)")
    ap.add_argument("--rounds", type=int, default=1, help="sweeps, paths interleaved; medians reported")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--paths", default="sdpa,local,linformer")
    ap.add_argument("--window", type=int, default=256, help="local attention's window W")
    ap.add_argument("--linformer-k", type=int, default=256)
    ap.add_argument("--timeout", type=float, default=None, help="seconds per point before it is given up")
    ap.add_argument("--plot", default=None, help="also draw tokens/s and peak memory into this PNG")
    ap.add_argument("--merge", nargs="*", default=[], metavar="JSON",
                    help="earlier outputs of this script whose rows join this run's (table, ratios, plot)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--point", default=None, help=argparse.SUPPRESS)  # "LENGTH,PATH": run one point here
    args = ap.parse_args()

    import torch
    torch.set_num_threads(args.threads)
    if args.point:
        length, path = args.point.split(",")
        print(json.dumps(point(int(length), args.budget, args.steps, path, args.device, args.window,
                               args.linformer_k, args.warmup)))
        return 0
    lengths = [int(x) for x in args.lengths.split(",")] if args.lengths else []
    paths = args.paths.split(",")
    runs: dict[tuple[int, str], list[dict]] = {}
    for _ in range(args.rounds):
        for length in lengths:
            for path in paths:
                runs.setdefault((length, path), []).append(_run_point(args, length, path))
                print(json.dumps(runs[length, path][-1]), file=sys.stderr)
    rows = [medians(r) for r in runs.values()]
    for name in args.merge:
        with open(name, encoding="utf-8") as f:
            earlier = json.load(f)
        rows += [{**r, "from": name, "steps": earlier["steps"], "warmup": earlier.get("warmup", 1)}
                 for r in earlier["rows"] if (r["length"], r["path"]) not in runs]
    rows.sort(key=lambda r: r["length"])
    paths = list(dict.fromkeys(paths + [r["path"] for r in rows]))
    if args.plot:
        plot(rows, args.plot)
    print(json.dumps({
        "benchmark": "length_scaling", "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()}, {args.threads} threads, torch {torch.__version__}, {args.device}",
        "shape": SHAPE, "budget_tokens": args.budget, "steps": args.steps, "warmup": args.warmup, "rounds": args.rounds,
        "window": args.window, "linformer_k": args.linformer_k, "rows": rows,
        "ratios": [x for p in paths if p != "sdpa" for x in ratios(rows, p)],
        "ratios_vs_math": [x for p in paths if p not in ("sdpa", "math") for x in ratios(rows, p, "math")],
    }, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
