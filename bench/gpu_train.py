"""bench/gpu.py's ``train`` section: one optimizer step at the base and big shapes, transduce as
its trainer steps (eager and compiled) against HF ``MarianMTModel`` and ``nn.Transformer``, as
target tokens/s and MFU; then the Multi30k recipe's small model eager, compiled and in CUDA graphs."""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import torch
import torch.nn.functional as F

from gpu_common import PAD, guarded, one_line, timed
from train_throughput import TorchTransformer, flops_per_step, marian_model
from transduce.config import ModelConfig, TrainConfig
from transduce.data.batch import collate
from transduce.model import Transformer
from transduce.progress import progress_bar

# (layers each side, d_model, heads, d_ff, sentences, tokens per sentence, vocabulary)
TRAIN_SHAPES = {"base": (6, 512, 8, 2048, 400, 64, 32000), "big": (6, 1024, 16, 4096, 200, 64, 32000)}
DRY_TRAIN_SHAPES = {"base": (2, 64, 4, 128, 8, 12, 500)}


def make_batch(n: int, t: int, vocab: int, device: torch.device):
    g = torch.Generator().manual_seed(0)
    pairs = [(torch.randint(4, vocab, (t - 1,), generator=g).tolist(),
              torch.randint(4, vocab, (t - 1,), generator=g).tolist()) for _ in range(n)]
    return collate(pairs).to(device)


def ours_step(shape: tuple, batch, device: torch.device, compiled: bool) -> Callable[[], None]:
    """One step as the Trainer takes it (``training/step.py``): forward and the fused projection +
    loss under bf16 autocast, backward, the gradient norm and the update (fused Adam on CUDA,
    skipped on the device if non-finite); no host read."""
    from transduce.training.step import build_optimizer, clip_and_step, compile_model, forward_backward

    layers, d, h, ff, _, _, vocab = shape
    torch.manual_seed(0)
    model = Transformer(ModelConfig(src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=d, n_heads=h,
                                    n_encoder_layers=layers, n_decoder_layers=layers, d_ff=ff,
                                    share_embeddings=True, max_positions=512)).to(device).train()
    opt = build_optimizer(model, TrainConfig(precision="bf16"), lr=1e-4)
    fwd = compile_model(model, BACKEND["name"]) if compiled else model
    params, found_inf = list(model.parameters()), torch.zeros((), device=device)
    n_tokens = float((batch.tgt_out != PAD).sum())

    def step() -> None:
        sums = forward_backward(fwd, [batch], 0.1, PAD, n_tokens, "bf16", device)
        if opt.defaults.get("fused"):
            clip_and_step(opt, params, sums[0], None, found_inf)
        else:  # foreach Adam (a CPU dry run): the Trainer steps after its host read
            opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def peer_step(model: torch.nn.Module, forward: Callable, batch, device: torch.device) -> Callable[[], None]:
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
    n_tokens = float((batch.tgt_out != PAD).sum())

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits = forward(batch)
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch.tgt_out.reshape(-1),
                               label_smoothing=0.1, ignore_index=PAD, reduction="sum")
        (loss / n_tokens).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def train_shape(name: str, shape: tuple, device: torch.device, runs: int, steps: int, peak: float) -> dict:
    layers, d, h, ff, n, t, vocab = shape
    batch = make_batch(n, t, vocab, device)
    makers: dict[str, Callable[[], Callable[[], None]]] = {
        "transduce": lambda: ours_step(shape, batch, device, False),
        "transduce compiled": lambda: ours_step(shape, batch, device, True),
        "nn.Transformer": lambda: (lambda m: peer_step(m, lambda b: m(b.src, b.tgt_in), batch, device))(
            TorchTransformer(layers, d, h, ff, vocab).to(device).train()),
    }
    mask = batch.src != PAD
    makers["hf marian"] = lambda: (lambda m: peer_step(m, lambda b: m(input_ids=b.src, attention_mask=mask,
                                                                    decoder_input_ids=b.tgt_in).logits, batch, device))(
        marian_model(layers, d, h, ff, vocab).to(device))
    fns, errors = {}, {}
    for k, make in makers.items():
        try:
            fn = make()
            for _ in range(3):  # warm-up (compiling, autotuning, allocator)
                fn()
            fns[k] = fn
        except Exception as e:  # noqa: BLE001 - one system failing must not lose the others
            errors[k] = one_line(e)
    times: dict[str, list[float]] = {k: [] for k in fns}
    with progress_bar(runs * len(fns), unit="runs", desc="timing") as bar:
        for _ in range(runs):
            for k, fn in fns.items():
                times[k].append(timed(lambda fn=fn: [fn() for _ in range(steps)], device) / steps)
                bar.update()
    flops = flops_per_step(layers, d, ff, batch, vocab)
    out: dict[str, Any] = {"shape": {"layers": layers, "d_model": d, "heads": h, "d_ff": ff, "vocab": vocab,
                                     "batch": f"{n}x{t}", "tgt_tokens": batch.n_tgt_tokens}}
    for k, ts in times.items():
        sec = statistics.median(ts)
        out[k] = {"tgt_tokens_per_s": round(batch.n_tgt_tokens / sec), "step_ms": round(sec * 1e3, 2),
                  "mfu": round(flops / sec / peak, 3)}
    if "hf marian" in out and "transduce" in out:
        for k in ("transduce", "transduce compiled"):
            if k in out:
                out[k]["vs_marian"] = round(out[k]["tgt_tokens_per_s"] / out["hf marian"]["tgt_tokens_per_s"], 2)
    if errors:
        out["errors"] = errors
    return out


def train_section(device: torch.device, dry: bool, runs: int, steps: int, peak: float) -> dict:
    shapes = DRY_TRAIN_SHAPES if dry else TRAIN_SHAPES
    out = {}
    for name, shape in shapes.items():
        out[name] = guarded(train_shape, name, shape, device, runs, steps, peak)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    out["recipe_step_modes"] = guarded(recipe_step_modes, device, 4 if dry else 200, dry)
    return out


# The Multi30k recipe's model (configs/multi30k_*.yaml) and its batch budget on a GPU.
RECIPE = dict(d_model=128, n_heads=4, n_encoder_layers=4, n_decoder_layers=4, d_ff=256, dropout=0.3, norm="pre",
              max_positions=256, src_vocab_size=8000, tgt_vocab_size=8000)
RECIPE_TOKENS = 8192
RECIPE_BUCKETS = {"one bucket": [16], "four buckets": [16, 24, 32, 40]}
DRY_RECIPE = dict(RECIPE, d_model=32, d_ff=64, n_encoder_layers=1, n_decoder_layers=1, src_vocab_size=300,
                  tgt_vocab_size=300)
# torch.compile's backend: a dry run on a CPU traces with dynamo but skips inductor's C++ builds
BACKEND = {"name": "inductor"}


def recipe_step_modes(device: torch.device, steps: int, dry: bool) -> dict:
    """Steps/s of the recipe's small model, where per-step overhead rules: the same step function
    (``GraphedStep``: forward, backward, clipping, fused Adam, the non-finite check on the device,
    its metrics read back every step as the Trainer does) run eagerly, with the model compiled,
    and captured in CUDA graphs; on square batches of one bucket and of four buckets in turn (which
    must not recompile or recapture per batch). bf16."""
    from cuda_graph_setup import random_batch
    from transduce.training.cuda_graphs import GraphedStep
    from transduce.training.step import build_optimizer, compile_model

    shape, tokens_per_batch = (DRY_RECIPE, 256) if dry else (RECIPE, RECIPE_TOKENS)
    out: dict[str, Any] = {"tokens_per_batch": tokens_per_batch}
    for mode in ("eager", "compiled", "graphed"):
        for name, lengths in RECIPE_BUCKETS.items():
            torch.manual_seed(0)
            model = Transformer(ModelConfig(**shape)).to(device)
            cfg = TrainConfig(precision="bf16", clip_norm=1.0, cuda_graphs=True)  # the fused, device-skipping Adam
            net = compile_model(model, BACKEND["name"]) if mode == "compiled" else model
            step = GraphedStep(net, build_optimizer(model, cfg), cfg, PAD, device, graphs=mode == "graphed")
            batches = []
            for i, length in enumerate(lengths * 2):
                rows = tokens_per_batch // length
                batch = random_batch(rows, length, rows - 2, shape["src_vocab_size"], seed=i)
                batches.append((batch.pin_memory() if device.type == "cuda" else batch).to(device))

            def run(n: int) -> int:
                tokens = 0
                for i in range(n):
                    batch = batches[i % len(batches)]
                    step(batch, 1e-4, batch.n_tgt_tokens).tolist()
                    tokens += batch.n_tgt_tokens
                return tokens
            warmup = timed(lambda: run(2 * len(batches)), device)  # compiles and captures happen here
            t0 = time.perf_counter()
            tokens = run(steps)
            sec = time.perf_counter() - t0
            out[f"{mode}, {name}"] = {"steps_per_s": round(steps / sec, 1), "tgt_tokens_per_s": round(tokens / sec),
                                      "warmup_s": round(warmup, 1), "graphs": len(step.captured) if step.graphs else 0}
    return out
