"""The trainer's Adam step on the CPU: torch's fused kernel vs ``foreach``, side by side.

The trainer (``training/step.build_optimizer``) steps Adam with torch's fused kernel wherever
torch has one (CUDA; the CPU from torch 2.4). This times one ``optimizer.step()`` of each on
the parameter shapes of a model (gradients random, the same for both), interleaved in rounds,
and prints the medians, their ratio and the largest difference of the two updated weights.

Usage:
    python bench/optimizer_step.py [--shape recipe|base|gpt2-small] [--rounds 20] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from transduce.config import ModelConfig, TrainConfig, model_preset
from transduce.model import DecoderOnlyLM, Transformer
from transduce.training.step import FUSED_CPU, build_optimizer


def model(shape: str) -> torch.nn.Module:
    if shape == "gpt2-small":  # GPT-2 small's shapes (124M parameters)
        cfg = ModelConfig(arch="decoder_only", d_model=768, n_heads=12, n_encoder_layers=0, n_decoder_layers=12,
                          d_ff=3072, src_vocab_size=50257, tgt_vocab_size=50257, max_positions=1024,
                          positions="learned", norm="pre")
        return DecoderOnlyLM(cfg)
    if shape == "recipe":  # configs/multi30k_en_de.yaml
        cfg = ModelConfig(d_model=128, n_heads=4, n_encoder_layers=4, n_decoder_layers=4, d_ff=256,
                          src_vocab_size=8000, tgt_vocab_size=8000, share_embeddings=True)
    else:
        cfg = model_preset("base", src_vocab_size=8000, tgt_vocab_size=8000, share_embeddings=True)
    return Transformer(cfg)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="recipe", choices=["recipe", "base", "gpt2-small"])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    if not FUSED_CPU:
        raise SystemExit("optimizer_step: torch < 2.4 has no fused CPU Adam")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    a = model(args.shape)
    b = model(args.shape)
    b.load_state_dict(a.state_dict())
    cfg = TrainConfig(lr=1e-3, schedule="constant")
    fused = build_optimizer(a, cfg, 1e-3)
    foreach = torch.optim.Adam(b.parameters(), lr=1e-3, betas=tuple(cfg.betas), eps=cfg.eps, foreach=True)
    gen = torch.Generator().manual_seed(0)
    for p, q in zip(a.parameters(), b.parameters()):
        p.grad = torch.randn(p.shape, generator=gen)
        q.grad = p.grad.clone()
    times: dict[str, list[float]] = {"fused": [], "foreach": []}
    for _ in range(args.rounds):
        for name, opt in (("fused", fused), ("foreach", foreach)):
            t = time.perf_counter()
            opt.step()
            times[name].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    diff = max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))
    print(json.dumps({"shape": args.shape, "parameters": sum(p.numel() for p in a.parameters()),
                      "threads": args.threads, "torch": torch.__version__, "load_average_1min": os.getloadavg()[0],
                      "fused_s": round(med["fused"], 5), "foreach_s": round(med["foreach"], 5),
                      "speedup": round(med["foreach"] / med["fused"], 2), "max_weight_diff": diff}, indent=1))


if __name__ == "__main__":
    main()
