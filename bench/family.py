"""The Transformer family: transduce's GPT, BERT and T5 vs Hugging Face GPT-2, BERT and T5, side by side.

Six sections (``--sections lm,mlm,sample,greedy,t5,t5-decode``), each racing our model against its
Hugging Face twin in this one process, interleaved in rounds, medians reported as JSON:

- ``lm``: training tokens/s of a decoder-only LM (``model.arch: decoder_only`` with GPT-2's
  options) vs ``GPT2LMHeadModel``;
- ``mlm``: training tokens/s of a masked LM (``model.arch: encoder_only`` with BERT's options)
  vs ``BertForMaskedLM``;
- ``sample``: top-k sampling tokens/s with a KV cache, ``--sample-batch`` prompts at once, vs
  HF ``generate``;
- ``greedy``: the same with greedy search (temperature 0), vs HF ``generate(do_sample=False)``;
- ``t5``: training tokens/s (source + target) of a T5 (``model.positions: relative`` with
  T5 1.0's options, ``interop/t5.py``) vs ``T5ForConditionalGeneration``;
- ``t5-decode``: greedy and beam-4 sentences/s of that T5, ``--sample-batch`` sources at once,
  exactly ``--new-tokens`` tokens each (EOS forbidden until then on both sides), our model as
  ``Translator`` prepares it vs HF ``generate``.

The twin is built by our exporters' weight mappings (``interop/gpt2.py``, ``interop/bert.py``),
so the weights are identical; each section first prints the largest logit difference on one batch
(and, for sampling, whether greedy continuations agree) to show the race is fair.

A training step is what each side's user runs: forward, loss, backward, gradient clipping to 1.0,
Adam (torch's fused kernel, as our CPU trainer builds it and Hugging Face's Trainer defaults
to from torch 2.8 on; ``foreach`` on torch < 2.4), in float32. Ours is the trainer's own path
(``training/step.py``: ``forward_backward`` with the output projection fused into the loss for
the LM, the masked-LM head on the selected positions only for the MLM, then the CPU branch of
``Trainer._queue_step``: clip, one host read of the step's metrics, step). Hugging Face's is
``model(input_ids, labels=...).loss`` (its loss on full (B, T, V) logits). Both see the same
batches: LM sequences of ``--seq`` tokens; MLM sequences of ``--seq`` tokens masked by our
``masked_batch`` (BERT's 15% / 80-10-10 rule); tokens/s counts the input tokens of the step.
Sampling: temperature 1, top-k 50, exactly ``--new-tokens`` new tokens per prompt on both sides
(EOS forbidden until then: our ``min_new_tokens``, HF's ``min_new_tokens``).

Shape (``--shape``): ``small`` is GPT-2 small's options at a size that trains on a 2-core CPU in
a few seconds a step: 4 layers, d_model 256, 4 heads, FFN 1024, 8k vocabulary (our translation
benchmarks' vocabulary), 16 x 128 tokens a step. ``tiny`` is for the smoke test. The T5 sections
use t5-small's shape (6 + 6 layers, d_model 512, 8 heads, FFN 2048) with the shape's vocabulary,
rows and sequence length (``--shape tiny``: the tiny shape). ``gpt2-small`` is GPT-2 small's own
shape (12 layers, d_model 768, 12 heads, FFN 3072, 50,257 tokens, 1,024 positions; random weights),
4 x 128 tokens a training step: fine-tuning and generation speed at the size people start from.

Usage:
    python bench/family.py [--sections lm,mlm,sample] [--runs 5] [--steps 2] [--threads 2]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from typing import Callable

import torch

from transduce.config import GenerationConfig, ModelConfig, TrainConfig
from transduce.data.batch import Batch, collate
from transduce.data.encoder_inputs import masked_batch
from transduce.interop.bert import bert_config, bert_state_dict
from transduce.config import DecodeConfig, model_preset
from transduce.interop.gpt2 import gpt2_config, gpt2_state_dict
from transduce.interop.t5 import hf_t5_config, hf_t5_state_dict
from transduce.inference import SearchSpec
from transduce.inference.generate import Generator
from transduce.inference.search.lm import generate_ids
from transduce.inference.translator import Translator
from transduce.model import DecoderOnlyLM, EncoderOnly, Transformer
from transduce.progress import progress_bar
from transduce.training.step import FUSED_CPU, build_optimizer, forward_backward

PAD, BOS, EOS, FIRST_ORDINARY = 0, 1, 2, 4
CLIP = 1.0
TOP_K = 50
SHAPES = {
    # layers, d_model, heads, d_ff, vocab, batch rows, sequence length
    "small": dict(layers=4, d_model=256, heads=4, d_ff=1024, vocab=8000, rows=16, seq=128),
    "tiny": dict(layers=2, d_model=32, heads=4, d_ff=64, vocab=200, rows=4, seq=16),
    # GPT-2 small's own shape (124M parameters, 1,024 positions), random weights; 4 x 128 tokens a step
    "gpt2-small": dict(layers=12, d_model=768, heads=12, d_ff=3072, vocab=50257, rows=4, seq=128, positions=1024),
}
GPT2_OPTIONS = dict(arch="decoder_only", norm="pre", positions="learned", activation="gelu_tanh",
                    scale_embeddings=False, n_encoder_layers=0)
BERT_OPTIONS = dict(arch="encoder_only", norm="post", positions="learned", activation="gelu", embed_norm=True,
                    scale_embeddings=False, layer_norm_eps=1e-12, n_decoder_layers=0)


def model_config(shape: dict, options: dict) -> ModelConfig:
    """Our model of ``shape`` with GPT-2's or BERT's ``options`` (dropout 0.1 as both)."""
    layers = {"n_decoder_layers" if options["arch"] == "decoder_only" else "n_encoder_layers": shape["layers"]}
    return ModelConfig(src_vocab_size=shape["vocab"], tgt_vocab_size=shape["vocab"], d_model=shape["d_model"],
                       n_heads=shape["heads"], d_ff=shape["d_ff"], dropout=0.1,
                       max_positions=shape.get("positions", 512),
                       **options, **layers)


def lm_pair(shape: dict):
    """Our decoder-only LM (random weights, seed 0) and the GPT2LMHeadModel with its weights."""
    import transformers

    torch.manual_seed(0)
    ours = DecoderOnlyLM(model_config(shape, GPT2_OPTIONS))
    hf = transformers.GPT2LMHeadModel(gpt2_config(ours.config))
    hf.load_state_dict(gpt2_state_dict(ours), strict=False)  # lm_head.weight is tied to wte
    hf.tie_weights()
    return ours, hf


def mlm_pair(shape: dict):
    """Our masked LM (random weights, seed 0) and the BertForMaskedLM with its weights."""
    import transformers

    torch.manual_seed(0)
    ours = EncoderOnly(model_config(shape, BERT_OPTIONS))
    hf = transformers.BertForMaskedLM(bert_config(ours.config))
    missing, unexpected = hf.load_state_dict(bert_state_dict(ours), strict=False)
    if missing or unexpected:
        raise RuntimeError(f"BERT weights do not map: missing {missing[:3]}, unexpected {unexpected[:3]}")
    return ours, hf


def text_batch(shape: dict, seed: int = 0) -> Batch:
    """``rows`` pairs of random ordinary tokens, collated: tgt_in/tgt_out (rows, seq) for an LM;
    src (rows, seq - 1), which :func:`masked_batch` turns into (rows, seq) with BOS."""
    g = torch.Generator().manual_seed(seed)
    n, t, v = shape["rows"], shape["seq"], shape["vocab"]
    pairs = [(torch.randint(FIRST_ORDINARY, v - 1, (t - 2,), generator=g).tolist(),
              torch.randint(FIRST_ORDINARY, v - 1, (t - 1,), generator=g).tolist()) for _ in range(n)]
    return collate(pairs)


def train_config() -> TrainConfig:
    """Adam as the paper (and our trainer's default), clipping as GPT-2/BERT recipes do."""
    return TrainConfig(optimizer="adam", lr=1e-4, schedule="constant", clip_norm=CLIP, label_smoothing=0.0)


def our_step(model: torch.nn.Module, batch: Batch) -> Callable[[], None]:
    """One training step as ``Trainer._queue_step`` + ``train_step`` run it on a CPU."""
    cfg = train_config()
    optimizer = build_optimizer(model, cfg, lr=cfg.lr)
    params = [p for p in model.parameters() if p.requires_grad]
    device = torch.device("cpu")
    model.train()

    def step() -> None:
        sums = forward_backward(model, [batch], cfg.label_smoothing, PAD, max(batch.n_tgt_tokens, 1),
                                cfg.precision, device)
        norm = torch.nn.utils.clip_grad_norm_(params, cfg.clip_norm, foreach=True)
        ok = torch.isfinite(sums[0]) & torch.isfinite(norm)
        _, _, _, applied = torch.cat([sums, norm.reshape(1), ok.reshape(1).float()]).tolist()
        if applied:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def hf_step(model: torch.nn.Module, inputs: dict) -> Callable[[], None]:
    """One training step as a Hugging Face user writes it (what its Trainer does in fp32)."""
    cfg = train_config()
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr, betas=cfg.betas, eps=cfg.eps,
                                 **({"fused": True} if FUSED_CPU else {"foreach": True}))  # HF Trainer's default
    model.train()

    def step() -> None:
        model(**inputs).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP, foreach=True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def hf_labels(labels: torch.Tensor) -> torch.Tensor:
    """Our PAD-means-ignored labels as Hugging Face's -100."""
    return labels.masked_fill(labels == PAD, -100)


def race(systems: dict[str, Callable[[], None]], runs: int, steps: int) -> dict[str, list[float]]:
    """One warm-up call each, then ``runs`` interleaved rounds of ``steps`` calls; the seconds
    per call of each system in each round."""
    for run in systems.values():
        run()
    times: dict[str, list[float]] = {name: [] for name in systems}
    with progress_bar(runs * len(systems), unit="runs", desc="timing") as bar:  # stderr: the JSON goes to stdout
        for _ in range(runs):
            for name, run in systems.items():
                start = time.perf_counter()
                for _ in range(steps):
                    run()
                times[name].append((time.perf_counter() - start) / steps)
                bar.update()
    return times


def report(rounds: dict[str, list[float]], tokens: int, unit: str) -> dict:
    """Median tokens/s per system, ours / Hugging Face (of the medians, and each round's, the
    spread a shared machine leaves), and each round's seconds."""
    seconds = {name: statistics.median(t) for name, t in rounds.items()}
    out: dict = {name: {f"{unit}_per_s": round(tokens / s, 1), "step_s": round(s, 4),
                        "rounds_s": [round(x, 3) for x in rounds[name]]} for name, s in seconds.items()}
    out["ratio_ours_vs_hf"] = round(seconds["hf"] / seconds["transduce"], 3)
    out["ratio_per_round"] = [round(h / o, 2) for o, h in zip(rounds["transduce"], rounds["hf"])]
    return out


@torch.no_grad()
def max_logit_diff(ours_logits: torch.Tensor, hf_logits: torch.Tensor) -> float:
    return float((ours_logits - hf_logits).abs().max())


def bench_lm(shape: dict, runs: int, steps: int) -> dict:
    ours, hf = lm_pair(shape)
    batch = text_batch(shape)
    with torch.no_grad():
        diff = max_logit_diff(ours.eval()(batch.tgt_in), hf.eval()(input_ids=batch.tgt_in).logits)
    # shift_labels: HF's loss reads our (already shifted) labels as they are, so both score T positions
    inputs = dict(input_ids=batch.tgt_in, labels=hf_labels(batch.tgt_out), shift_labels=hf_labels(batch.tgt_out))
    seconds = race({"transduce": our_step(ours, batch), "hf": hf_step(hf, inputs)}, runs, steps)
    tokens = int((batch.tgt_in != PAD).sum())
    return {"max_logit_diff": diff, "batch": list(batch.tgt_in.shape), **report(seconds, tokens, "tokens")}


def bench_mlm(shape: dict, runs: int, steps: int) -> dict:
    ours, hf = mlm_pair(shape)
    batch = masked_batch(text_batch(shape), ours.mask_id, torch.Generator().manual_seed(0))
    mask = (batch.src != PAD).long()
    with torch.no_grad():
        diff = max_logit_diff(ours.eval().mlm_logits(ours(batch.src)), hf.eval()(input_ids=batch.src,
                                                                                  attention_mask=mask).logits)
    inputs = dict(input_ids=batch.src, attention_mask=mask, labels=hf_labels(batch.tgt_out))
    seconds = race({"transduce": our_step(ours, batch), "hf": hf_step(hf, inputs)}, runs, steps)
    tokens = int(mask.sum())
    return {"max_logit_diff": diff, "batch": list(batch.src.shape), "masked_tokens": batch.n_tgt_tokens,
            **report(seconds, tokens, "tokens")}


def prompts(shape: dict, rows: int, length: int, seed: int = 1) -> torch.Tensor:
    """BOS + random ordinary tokens. (rows, length)."""
    g = torch.Generator().manual_seed(seed)
    body = torch.randint(FIRST_ORDINARY, shape["vocab"], (rows, length - 1), generator=g)
    return torch.cat([torch.full((rows, 1), BOS), body], dim=1)


def our_sampler(model: DecoderOnlyLM, ids: torch.Tensor, new: int, temperature: float) -> Callable[[], int]:
    """``generate_ids`` on the model as ``Generator`` prepares it (what ``transduce generate``
    runs: oneDNN linear layers on CPU, as our translation); returns tokens made."""
    model = Generator(model, tokenizer=None).model
    gen = GenerationConfig(max_new_tokens=new, min_new_tokens=new, temperature=temperature,
                           top_k=TOP_K if temperature else 0, batch_size=len(ids))
    g = torch.Generator().manual_seed(0)
    return lambda: sum(len(row) for row in generate_ids(model, ids, gen, g))


def hf_sampler(model, ids: torch.Tensor, new: int, temperature: float) -> Callable[[], int]:
    """HF ``generate`` with its KV cache, never PAD or BOS (as ours), exactly ``new`` tokens."""
    options = dict(do_sample=True, temperature=temperature, top_k=TOP_K) if temperature else dict(do_sample=False)
    mask = torch.ones_like(ids)

    def run() -> int:
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                             suppress_tokens=[PAD, BOS], pad_token_id=PAD, eos_token_id=EOS, bos_token_id=BOS,
                             use_cache=True, **options)
        return int(out[:, ids.shape[1]:].numel())
    return run


@torch.inference_mode()
def bench_sample(shape: dict, runs: int, rows: int, prompt_len: int, new: int, temperature: float = 1.0) -> dict:
    """``sample`` (top-k, ``temperature`` 1) or ``greedy`` (``temperature`` 0) generation tokens/s."""
    ours, hf = lm_pair(shape)
    ours.eval(), hf.eval()
    ids = prompts(shape, rows, prompt_len)
    diff = max_logit_diff(ours(ids), hf(input_ids=ids).logits)
    greedy_new = new  # equal over the tokens the race times
    greedy_ours = torch.tensor(generate_ids(ours, ids, GenerationConfig(max_new_tokens=greedy_new,
                                                                        min_new_tokens=greedy_new, temperature=0)))
    out_hf = hf.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=greedy_new,
                         min_new_tokens=greedy_new, do_sample=False, suppress_tokens=[PAD, BOS], pad_token_id=PAD,
                         eos_token_id=EOS)[:, ids.shape[1]:]
    systems = {"transduce": our_sampler(ours, ids, new, temperature), "hf": hf_sampler(hf, ids, new, temperature)}
    for name, run in systems.items():
        if run() != rows * new:
            raise RuntimeError(f"{name} did not make {rows} x {new} tokens")
    seconds = race(systems, runs, 1)
    return {"max_logit_diff": diff, "greedy_rows_equal": int((greedy_ours == out_hf).all(dim=1).sum()),
            "prompts": [rows, prompt_len], "new_tokens": new, **report(seconds, rows * new, "tokens")}


def t5_pair(shape: dict):
    """Our T5 (t5-small's shape and options, the shape's vocabulary; random weights, seed 0) and
    the T5ForConditionalGeneration with its weights."""
    import transformers

    torch.manual_seed(0)
    small = dict(d_model=shape["d_model"], n_heads=shape["heads"], n_encoder_layers=shape["layers"],
                 n_decoder_layers=shape["layers"], d_ff=shape["d_ff"]) if shape is SHAPES["tiny"] else {}
    ours = Transformer(model_preset("t5-small", src_vocab_size=shape["vocab"], tgt_vocab_size=shape["vocab"],
                                    **small))
    config = {k: v for k, v in hf_t5_config(ours.config).items() if k not in ("model_type", "architectures")}
    hf = transformers.T5ForConditionalGeneration(transformers.T5Config(**config))
    missing, unexpected = hf.load_state_dict(hf_t5_state_dict(ours), strict=False)
    if unexpected or set(missing) - {"encoder.embed_tokens.weight", "decoder.embed_tokens.weight"}:
        raise RuntimeError(f"T5 weights do not map: missing {missing[:3]}, unexpected {unexpected[:3]}")
    return ours, hf


def bench_t5(shape: dict, runs: int, steps: int) -> dict:
    ours, hf = t5_pair(shape)
    batch = text_batch(shape)
    mask = (batch.src != PAD).long()
    with torch.no_grad():
        hf_logits = hf.eval()(input_ids=batch.src, attention_mask=mask, decoder_input_ids=batch.tgt_in).logits
        diff = max_logit_diff(ours.eval()(batch.src, batch.tgt_in), hf_logits)
    inputs = dict(input_ids=batch.src, attention_mask=mask, decoder_input_ids=batch.tgt_in,
                  labels=hf_labels(batch.tgt_out))
    seconds = race({"transduce": our_step(ours, batch), "hf": hf_step(hf, inputs)}, runs, steps)
    tokens = int(mask.sum() + (batch.tgt_in != PAD).sum())
    return {"max_logit_diff": diff, "batch": [list(batch.src.shape), list(batch.tgt_in.shape)],
            **report(seconds, tokens, "tokens")}


def t5_searches(ours: Transformer, hf, src: torch.Tensor, beam: int, new: int) -> dict[str, Callable[[], int]]:
    """Our search on the model as ``Translator`` prepares it, and HF ``generate``; each makes
    exactly ``new`` tokens per sentence and returns the sentences it translated."""
    model = Translator(ours, tokenizer=None).model
    spec = SearchSpec(DecodeConfig(beam=beam, lenpen=0.0, max_len_a=0.0, max_len_b=new, min_len=new))
    mask = (src != PAD).long()
    options = dict(length_penalty=0.0, early_stopping=True) if beam > 1 else {}

    def run_ours() -> int:
        out = spec.run(model, src)
        return int((out.lengths[:, 0] == new).sum())

    def run_hf() -> int:
        out = hf.generate(input_ids=src, attention_mask=mask, num_beams=beam, max_new_tokens=new, min_new_tokens=new,
                          do_sample=False, suppress_tokens=[PAD, BOS], use_cache=True, **options)
        return int(((out[:, 1:] != PAD).sum(1) == new).sum())
    return {"transduce": run_ours, "hf": run_hf}


@torch.inference_mode()
def bench_t5_decode(shape: dict, runs: int, rows: int, new: int) -> dict:
    ours, hf = t5_pair(shape)
    ours.eval(), hf.eval()
    src = text_batch({**shape, "rows": rows, "seq": min(shape["seq"], 32)}).src
    with torch.no_grad():
        # equal over the tokens the race times, not a shorter prefix of them
        greedy = SearchSpec(DecodeConfig(beam=1, max_len_a=0.0, max_len_b=new, min_len=new)).run(ours, src)
        greedy = greedy.tokens[:, 0, :new]
        hf_greedy = hf.generate(input_ids=src, attention_mask=(src != PAD).long(), max_new_tokens=new,
                                min_new_tokens=new, do_sample=False, suppress_tokens=[PAD, BOS])[:, 1:new + 1]
    out: dict = {"greedy_rows_equal": int((greedy == hf_greedy).all(dim=1).sum()), "sources": list(src.shape),
                 "new_tokens": new}
    for beam in (1, 4):
        systems = t5_searches(ours, hf, src, beam, new)
        for name, run in systems.items():
            if run() != rows:
                raise RuntimeError(f"{name} did not make {rows} x {new} tokens with beam {beam}")
        out["greedy" if beam == 1 else "beam4"] = report(race(systems, runs, 1), rows, "sentences")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sections", default="lm,mlm,sample,greedy,t5,t5-decode",
                   help="comma-separated subset of lm,mlm,sample,greedy,t5,t5-decode")
    p.add_argument("--shape", choices=list(SHAPES), default="small")
    p.add_argument("--runs", type=int, default=5, help="interleaved timed rounds")
    p.add_argument("--steps", type=int, default=2, help="training steps per timed round")
    p.add_argument("--sample-batch", type=int, default=32,
                   help="prompts sampled (t5-decode: sources translated) at once")
    p.add_argument("--prompt-len", type=int, default=16, help="prompt tokens, BOS included")
    p.add_argument("--new-tokens", type=int, default=64, help="tokens sampled per prompt")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    sections = args.sections.split(",")
    unknown = set(sections) - {"lm", "mlm", "sample", "greedy", "t5", "t5-decode"}
    if unknown:
        p.error(f"--sections: unknown {', '.join(sorted(unknown))}; choose from lm, mlm, sample, greedy, t5, "
                "t5-decode")
    torch.set_num_threads(args.threads)
    import transformers

    shape = SHAPES[args.shape]
    load_before = os.getloadavg()[0]
    results: dict[str, dict] = {}
    if "lm" in sections:
        results["lm"] = bench_lm(shape, args.runs, args.steps)
    if "mlm" in sections:
        results["mlm"] = bench_mlm(shape, args.runs, args.steps)
    if "sample" in sections:
        results["sample"] = bench_sample(shape, args.runs, args.sample_batch, args.prompt_len, args.new_tokens)
    if "greedy" in sections:
        results["greedy"] = bench_sample(shape, args.runs, args.sample_batch, args.prompt_len, args.new_tokens, 0.0)
    if "t5" in sections:
        results["t5"] = bench_t5(shape, args.runs, args.steps)
    if "t5-decode" in sections:
        results["t5-decode"] = bench_t5_decode(shape, args.runs, args.sample_batch, args.new_tokens)
    out = {"date": datetime.date.today().isoformat(), "machine": platform.processor() or platform.machine(),
           "cpus": os.cpu_count(), "threads": args.threads, "torch": torch.__version__,
           "transformers": transformers.__version__, "python": sys.version.split()[0],
           "shape": {**shape, "optimizer": f"Adam ({'fused' if FUSED_CPU else 'foreach'}), clip 1.0",
                     "precision": "fp32"},
           "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)], "results": results}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
