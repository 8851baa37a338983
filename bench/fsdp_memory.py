"""Per-rank training memory under DDP and under FSDP (``train.fsdp``), with torchrun.

Each rank builds the model, wraps it as the trainer does (DDP, or ``shard_model``), takes a few
Adam steps on a random batch through the trainer's ``forward_backward`` and reports, before the
gradients are dropped, the bytes this rank holds of the parameters, their gradients and Adam's
state (a DTensor counts its local shard), and the process's peak resident memory. Run it once per
mode: the peak is the process's whole life.

Shapes: ``base`` (the paper's base: 6+6 layers, d 512, FFN 2048, 32k shared vocabulary, tied),
``big`` (d 1024, FFN 4096, 16 heads), ``tiny`` (a check that it runs).

Usage:
    torchrun --standalone --nproc_per_node=2 bench/fsdp_memory.py --mode ddp|fsdp [--shape base]
"""

from __future__ import annotations

import argparse
import json
import os
import resource

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from transduce.config import ModelConfig, TrainConfig
from transduce.data.batch import collate
from transduce.model.io import build_model
from transduce.training.sharding import shard_model
from transduce.training.step import build_optimizer, forward_backward

SHAPES = {
    "tiny": dict(d_model=32, n_heads=2, n_encoder_layers=1, n_decoder_layers=1, d_ff=64, vocab=200),
    "base": dict(d_model=512, n_heads=8, n_encoder_layers=6, n_decoder_layers=6, d_ff=2048, vocab=32000),
    "big": dict(d_model=1024, n_heads=16, n_encoder_layers=6, n_decoder_layers=6, d_ff=4096, vocab=32000),
}


def _local_bytes(tensors) -> int:
    return sum((t.to_local() if isinstance(t, DTensor) else t).nbytes for t in tensors)


def measure(shape: str, mode: str, steps: int) -> dict:
    """This rank's bytes of weights, gradients and optimizer state after ``steps`` steps."""
    s = dict(SHAPES[shape])
    vocab = s.pop("vocab")
    torch.manual_seed(0)
    model = build_model(ModelConfig(src_vocab_size=vocab, tgt_vocab_size=vocab, share_embeddings=True, **s))
    step_model: torch.nn.Module = model
    if mode == "fsdp":
        shard_model(model, "fp32")
    else:
        step_model = DistributedDataParallel(model)
    optimizer = build_optimizer(model, TrainConfig(lr=1e-4, schedule="constant"), lr=1e-4)
    g = torch.Generator().manual_seed(dist.get_rank())
    pairs = [tuple(torch.randint(4, vocab, (32,), generator=g).tolist() for _ in range(2)) for _ in range(16)]
    batch = collate(pairs)
    for _ in range(steps):
        forward_backward(step_model, [batch], 0.1, 0, batch.n_tgt_tokens * dist.get_world_size(), "fp32",
                         torch.device("cpu"))
        optimizer.step()
        grads = _local_bytes(p.grad for p in model.parameters() if p.grad is not None)
        optimizer.zero_grad(set_to_none=True)
    states = [v for st in optimizer.state.values() for v in st.values() if torch.is_tensor(v)]
    return {"params": sum(p.numel() for p in model.parameters()),
            "weights_mb": _local_bytes(model.parameters()) / 2**20, "grads_mb": grads / 2**20,
            "optimizer_mb": _local_bytes(states) / 2**20,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("ddp", "fsdp"), required=True)
    parser.add_argument("--shape", choices=tuple(SHAPES), default="base")
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dist.init_process_group("gloo")
    rows = [None] * dist.get_world_size()
    dist.all_gather_object(rows, measure(args.shape, args.mode, args.steps))
    if dist.get_rank() == 0:
        print(json.dumps({"shape": args.shape, "mode": args.mode, "world_size": dist.get_world_size(),
                          "torch": torch.__version__, "ranks": rows}, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
