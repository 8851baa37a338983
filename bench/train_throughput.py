"""Training throughput: transduce vs Hugging Face MarianMTModel vs torch.nn.Transformer.

Each system trains a random-weight model of the same shape on the same batch (one
forward + backward + Adam step, label smoothing 0.1), in one process, interleaved, and reports
the median target tokens/s after a warm-up. The peers use ``F.cross_entropy(label_smoothing=0.1)``
(what their users get); transduce trains as its trainer does, with the output projection and the
loss fused (no (N, V) logits stored). Model FLOPs utilisation
(MFU) is the model's matmul FLOPs per second against a measured ``torch.mm`` peak.

The row "transduce, nn.Dropout" is transduce with PyTorch's dropout instead of the trainer's CPU
dropout (training/dropout.py): the CPU dropout's gain, side by side.

Shapes: ``tiny`` (3+3 layers, d 256, FFN 1024, 128 x 32 tokens), ``base`` (the paper's base,
64 x 32), ``recipe`` (configs/multi30k_*.yaml: 4+4, d 128, FFN 256, 240 x 16); 8k vocabulary.

Needs ``transformers`` for the Marian row (``pip install 'transduce[bench]'``); without it the
row is left out.

Usage:
    python bench/train_throughput.py [--shape tiny|base|recipe|all] [--runs 4] [--threads 2]
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import time
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from transduce.config import ModelConfig
from transduce.data.batch import collate
from transduce.model import Transformer
from transduce.model.embeddings import sinusoidal_table
from transduce.progress import progress_bar
from transduce.training.dropout import use_cpu_dropout
from transduce.training.loss import projected_label_smoothed_loss
from transduce.training.step import FUSED_CPU

VOCAB, PAD = 8000, 0
SHAPES = {
    # (layers each side, d_model, heads, d_ff, sentences, tokens per sentence)
    "tiny": (3, 256, 4, 1024, 128, 32),
    "base": (6, 512, 8, 2048, 64, 32),
    "recipe": (4, 128, 4, 256, 240, 16),  # configs/multi30k_*.yaml's model, a Multi30k-sized batch
}


def make_batch(n: int, t: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    pairs = [(torch.randint(4, VOCAB, (t - 1,), generator=g).tolist(),
              torch.randint(4, VOCAB, (t - 1,), generator=g).tolist()) for _ in range(n)]
    return collate(pairs)


def torch_loss(logits, target):
    """What a peer's user gets: F.cross_entropy with label smoothing (summed, pads ignored)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), label_smoothing=0.1,
                           ignore_index=PAD, reduction="sum")


def our_loss(model: Transformer) -> Callable:
    """What the trainer does in float32: projection and loss fused (training/loss.py)."""
    return lambda hidden, target: projected_label_smoothed_loss(hidden, model.output_proj.weight, target, 0.1, PAD).loss


def train_step(model: nn.Module, forward: Callable, batch, loss_fn: Callable = torch_loss) -> Callable[[], None]:
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9,  # every side: the trainer's Adam
                           **({"fused": True} if FUSED_CPU else {"foreach": True}))
    n_tokens = int((batch.tgt_out != PAD).sum())

    def step() -> None:
        logits = forward(batch)                                          # (B, T, V)
        (loss_fn(logits, batch.tgt_out) / n_tokens).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def ours(layers, d, h, ff, batch, cpu_dropout: bool = True):
    """As the trainer runs on the CPU: its dropout (training/dropout.py) unless ``cpu_dropout`` is off."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, d_model=d, n_heads=h,
                                    n_encoder_layers=layers, n_decoder_layers=layers, d_ff=ff)).train()
    if cpu_dropout:
        use_cpu_dropout(model)
    return train_step(model, lambda b: model(b.src, b.tgt_in, project=False), batch, our_loss(model))


def ours_torch_dropout(layers, d, h, ff, batch):
    return ours(layers, d, h, ff, batch, cpu_dropout=False)


class TorchTransformer(nn.Module):
    """``nn.Transformer`` with shared scaled embeddings, sinusoidal positions, tied output."""

    def __init__(self, layers, d, h, ff, vocab=VOCAB):
        super().__init__()
        self.embed = nn.Embedding(vocab, d, padding_idx=PAD)
        self.register_buffer("pe", sinusoidal_table(512, d), persistent=False)
        self.core = nn.Transformer(d, h, layers, layers, ff, dropout=0.1, batch_first=True)
        self.scale, self.drop = d ** 0.5, nn.Dropout(0.1)

    def forward(self, src, tgt):
        emb = lambda x: self.drop(self.embed(x) * self.scale + self.pe[: x.shape[1]])  # noqa: E731
        t = tgt.shape[1]
        out = self.core(emb(src), emb(tgt), tgt_mask=nn.Transformer.generate_square_subsequent_mask(t, tgt.device),
                        src_key_padding_mask=src == PAD, memory_key_padding_mask=src == PAD, tgt_is_causal=True)
        return out @ self.embed.weight.T


def plain_torch(layers, d, h, ff, batch):
    torch.manual_seed(0)
    model = TorchTransformer(layers, d, h, ff).train()
    return train_step(model, lambda b: model(b.src, b.tgt_in), batch)


def marian_model(layers, d, h, ff, vocab=VOCAB):
    """A random-weight MarianMTModel of the shape, for training."""
    from transformers import MarianConfig, MarianMTModel
    cfg = MarianConfig(vocab_size=vocab, d_model=d, encoder_layers=layers, decoder_layers=layers,
                       encoder_attention_heads=h, decoder_attention_heads=h, encoder_ffn_dim=ff,
                       decoder_ffn_dim=ff, max_position_embeddings=512, activation_function="relu",
                       dropout=0.1, attention_dropout=0.0, activation_dropout=0.0, scale_embedding=True,
                       pad_token_id=PAD, eos_token_id=2, decoder_start_token_id=1)
    torch.manual_seed(0)
    return MarianMTModel(cfg).train()


def marian(layers, d, h, ff, batch):
    model = marian_model(layers, d, h, ff)
    mask = batch.src != PAD
    return train_step(model, lambda b: model(input_ids=b.src, attention_mask=mask,
                                             decoder_input_ids=b.tgt_in).logits, batch)


def flops_per_step(layers, d, ff, batch, vocab=VOCAB) -> float:
    """Matmul FLOPs of forward + backward (3x forward) for this batch, padding included."""
    b, s = batch.src.shape
    t = batch.tgt_in.shape[1]
    enc = b * s * layers * (2 * (4 * d * d + 2 * d * ff) + 4 * s * d)
    dec = b * t * layers * (2 * (6 * d * d + 2 * d * ff) + 4 * t * d + 4 * s * d)
    cross_kv = b * s * layers * 2 * 2 * d * d
    out = b * t * 2 * d * vocab
    return 3.0 * (enc + dec + cross_kv + out)


def mm_peak(n: int = 2048, reps: int = 10) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.mm(a, b)
        times.append(time.perf_counter() - t0)
    return 2 * n ** 3 / statistics.median(times)


def bench_shape(name: str, runs: int, steps: int) -> dict:
    layers, d, h, ff, n, t = SHAPES[name]
    batch = make_batch(n, t)
    systems = {"transduce": ours, "transduce, nn.Dropout": ours_torch_dropout, "nn.Transformer": plain_torch}
    try:
        import transformers  # noqa: F401
        systems["marian"] = marian
    except ImportError:
        pass
    steps_fns = {k: fn(layers, d, h, ff, batch) for k, fn in systems.items()}
    for fn in steps_fns.values():  # warm-up
        fn()
    times: dict[str, list[float]] = {k: [] for k in steps_fns}
    with progress_bar(runs * len(steps_fns), unit="runs", desc=name) as bar:  # stderr: the JSON goes to stdout
        for _ in range(runs):  # interleaved
            for k, fn in steps_fns.items():
                t0 = time.perf_counter()
                for _ in range(steps):
                    fn()
                times[k].append((time.perf_counter() - t0) / steps)
                bar.update()
    flops = flops_per_step(layers, d, ff, batch)
    result = {}
    for k, ts in times.items():
        sec = statistics.median(ts)
        result[k] = {"tgt_tokens_per_s": round(batch.n_tgt_tokens / sec), "step_s": round(sec, 4),
                     "gflops": round(flops / sec / 1e9, 1)}
    best_peer = max(v["tgt_tokens_per_s"] for k, v in result.items() if not k.startswith("transduce"))
    result["transduce"]["vs_best_peer"] = round(result["transduce"]["tgt_tokens_per_s"] / best_peer, 2)
    return {"shape": {"layers": layers, "d_model": d, "heads": h, "d_ff": ff, "vocab": VOCAB,
                      "batch": f"{n}x{t}", "tgt_tokens": batch.n_tgt_tokens}, "systems": result}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=[*SHAPES, "all"], default="tiny")
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3, help="steps per timed run")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    peak = mm_peak()
    shapes = list(SHAPES) if args.shape == "all" else [args.shape]
    report = {"date": datetime.date.today().isoformat(), "machine": platform.processor() or platform.machine(),
              "torch": torch.__version__, "threads": args.threads, "mm_peak_gflops": round(peak / 1e9, 1),
              "results": {}}
    for name in shapes:
        r = bench_shape(name, args.runs, args.steps)
        for v in r["systems"].values():
            v["mfu"] = round(v["gflops"] * 1e9 / peak, 3)
        report["results"][name] = r
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
