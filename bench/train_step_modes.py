"""Training-step modes side by side: eager, compiled (``train.compile``) and CUDA-graphed
(``train.cuda_graphs``), on the Multi30k recipe's model (configs/multi30k_*.yaml: 4+4 layers,
d 128, FFN 256, 8k vocabulary) with its 2,048-token batches.

Each mode runs the same step function (``training.graphs.GraphedStep``: forward, backward,
clipping, fused Adam, the non-finite check on the device) and reads its metrics back every step,
as the Trainer does. ``fixed``: one bucket (128 x 16); ``buckets``: four square buckets in turn
(L = 16, 24, 32, 40, ``2048 // L`` rows each), which must not recompile or capture per batch.
On a CPU the graphed mode runs eagerly (no capture there): the script dry-runs.

Usage:
    python bench/train_step_modes.py [--steps 300] [--precision bf16] [--modes eager,compiled,graphed]
"""

from __future__ import annotations

import argparse
import datetime
import json
import time

import torch

from transduce.config import ModelConfig, TrainConfig
from transduce.model import Transformer
from transduce.training.graphs import GraphedStep, random_batch
from transduce.training.step import build_optimizer, compile_model

VOCAB, MAX_TOKENS = 8000, 2048
SHAPES = {"fixed": [16], "buckets": [16, 24, 32, 40]}


def make_step(mode: str, precision: str, device: torch.device) -> GraphedStep:
    torch.manual_seed(0)
    model_cfg = ModelConfig(d_model=128, n_heads=4, n_encoder_layers=4, n_decoder_layers=4, d_ff=256, dropout=0.3,
                            norm="pre", max_positions=256, src_vocab_size=VOCAB, tgt_vocab_size=VOCAB)
    model = Transformer(model_cfg).to(device)
    # cuda_graphs=True everywhere: the fused (device-skipping) optimizer on a CPU too
    cfg = TrainConfig(precision=precision, clip_norm=1.0, cuda_graphs=True)
    optimizer = build_optimizer(model, cfg)
    net = compile_model(model) if mode == "compiled" else model
    return GraphedStep(net, optimizer, cfg, model_cfg.pad_id, device, graphs=mode == "graphed")


def time_mode(mode: str, shapes: list[int], steps: int, precision: str, device: torch.device) -> dict:
    step = make_step(mode, precision, device)
    batches = []
    for i, length in enumerate(shapes * 2):
        batch = random_batch(MAX_TOKENS // length, length, MAX_TOKENS // length - 2, VOCAB, seed=i)
        batches.append((batch.pin_memory() if device.type == "cuda" else batch).to(device))
    t0 = time.perf_counter()
    for i in range(2 * len(batches)):  # compiles and captures happen here
        step(batches[i % len(batches)], 1e-4, batches[i % len(batches)].n_tgt_tokens).tolist()
    warmup = time.perf_counter() - t0
    tokens, t0 = 0, time.perf_counter()
    for i in range(steps):
        batch = batches[i % len(batches)]
        step(batch, 1e-4, batch.n_tgt_tokens).tolist()
        tokens += batch.n_tgt_tokens
    sec = time.perf_counter() - t0
    return {"steps_per_s": round(steps / sec, 1), "tgt_tokens_per_s": round(tokens / sec),
            "warmup_s": round(warmup, 1), "graphs": len(step.captured) if step.graphs else 0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--precision", default="bf16", choices=["fp32", "bf16"])
    ap.add_argument("--modes", default="eager,compiled,graphed")
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    report = {"date": datetime.date.today().isoformat(), "torch": torch.__version__,
              "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
              "precision": args.precision, "results": {}}
    for mode in args.modes.split(","):
        for name, shapes in SHAPES.items():
            report["results"][f"{mode}/{name}"] = time_mode(mode, shapes, args.steps, args.precision, device)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
