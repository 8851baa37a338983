"""A tiny model and square batches for the CUDA-graph training step (``train.cuda_graphs``): what
tests/training/test_cuda_graphs.py, bench/gpu_checks.py and bench/gpu.py race the graphed step on."""

from __future__ import annotations

import torch

from transduce.config import ModelConfig, TrainConfig
from transduce.data.batch import Batch, collate
from transduce.model import Transformer
from transduce.training.step import build_optimizer


def tiny_setup(device: torch.device, precision: str = "fp32", seed: int = 0):
    """A small model, its fused optimizer, a recipe and the PAD id: ``(model, optimizer, cfg, pad_id)``."""
    torch.manual_seed(seed)
    model_cfg = ModelConfig(d_model=64, n_heads=4, n_encoder_layers=2, n_decoder_layers=2, d_ff=128, dropout=0.0,
                            src_vocab_size=300, tgt_vocab_size=300, max_positions=128)
    model = Transformer(model_cfg).to(device)
    cfg = TrainConfig(precision=precision, clip_norm=1.0, warmup_steps=0, schedule="constant", lr=1e-3,
                      cuda_graphs=True)
    return model, build_optimizer(model, cfg), cfg, model_cfg.pad_id


def random_batch(rows: int, length: int, real_rows: int, vocab: int, seed: int) -> Batch:
    """A ``(rows, length)`` square batch of random pairs, ``real_rows`` of them real and shorter
    than ``length``, the rest dummy rows (what ``train.cuda_graphs`` trains on)."""
    g = torch.Generator().manual_seed(seed)
    pairs = []
    for _ in range(real_rows):
        s, t = torch.randint(1, length - 1, (2,), generator=g).tolist()
        pairs.append((torch.randint(4, vocab, (s,), generator=g).tolist(),
                      torch.randint(4, vocab, (t,), generator=g).tolist()))
    return collate(pairs).padded(rows, length, length)
