"""The ``tensorrt`` section of bench/gpu.py: fp16 TensorRT engines (``transduce export --format
tensorrt``, run by ``--backend tensorrt``) against the PyTorch model in bf16 as a Translator runs it
on CUDA, greedy and beam 4, on the same searches (issue #36).

- ``base_random``: a random base-shape model (6+6, d 512, 32k vocabulary), 256 sentences of 24
  tokens, every output forced to 32 tokens; sentences/s of each and the share of outputs that are
  identical (random weights: no BLEU).
- ``multi30k``: a trained model directory (``--model-dir``) on the 1,000 test_2016_flickr
  sentences: sentences/s, BLEU of each against the references and the difference.

Without CUDA or the ``tensorrt`` package the section records ``{"skipped": reason}`` (so the dry
run on a CPU, and a GPU machine without TensorRT, go on). The engines are built once per model,
timed (``build_s``), in a temporary directory.
"""

from __future__ import annotations

import contextlib
import gzip
import importlib.util
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

from transduce.config import DecodeConfig, ModelConfig, Runtime
from transduce.model import Transformer

EOS = 2
BASE = dict(layers=6, d=512, h=8, ff=2048, vocab=32000, sentences=256, src_len=24, out_len=32)
# Translator batches: source tokens per batch, and the engines' most decoder rows (beam 4 of the
# shortest sentences such a batch holds)
BATCH_TOKENS, MAX_ROWS = 1024, 2048


def why_skipped(device: torch.device) -> str | None:
    if device.type != "cuda":
        return "TensorRT engines need a CUDA device (this run is on the CPU)"
    if importlib.util.find_spec("tensorrt") is None:
        return "the tensorrt package is not installed (pip install 'transduce[tensorrt]')"
    return None


def build_engines(model_dir: Path, out: Path, precision: str = "fp16") -> float:
    """export --format tensorrt of ``model_dir`` into ``out``; the seconds it took."""
    from transduce.interop import export_model
    from transduce.interop.tensorrt import EngineBuild

    t0 = time.perf_counter()
    export_model(model_dir, "tensorrt", out, build=EngineBuild(precision, MAX_ROWS))
    return round(time.perf_counter() - t0, 1)


def base_random(device: torch.device, runs: int, work: Path, measure: Callable) -> dict:
    """Token level: the searches over the engines vs over the bf16 model (see the module doc)."""
    from transduce.inference import SearchSpec, prepare_for_decoding
    from transduce.inference.backends.onnx import open_graphs
    from transduce.model.io import save_model

    s = BASE
    torch.manual_seed(0)
    cfg = ModelConfig(src_vocab_size=s["vocab"], tgt_vocab_size=s["vocab"], d_model=s["d"], n_heads=s["h"],
                      n_encoder_layers=s["layers"], n_decoder_layers=s["layers"], d_ff=s["ff"], dropout=0.0,
                      share_embeddings=True, max_positions=256)
    model = Transformer(cfg).eval()
    save_model(model, work / "base_model")
    build_s = build_engines(work / "base_model", work / "base_engines")
    engines = open_graphs(cfg, device, Runtime(device="cuda", precision="fp16", backend="tensorrt",
                                               engines=str(work / "base_engines")))
    ours = prepare_for_decoding(model.to(device), cast=torch.bfloat16)
    src = torch.randint(3, s["vocab"], (s["sentences"], s["src_len"] + 1), device=device)
    src[:, -1] = EOS
    out: dict[str, Any] = {"shape": dict(s), "build_s": build_s}
    for beam in (1, 4):
        decode = DecodeConfig(beam=beam, max_len_a=0.0, max_len_b=s["out_len"], min_len=s["out_len"])

        def run(m, dtype) -> Callable[[], Any]:
            def go():
                with torch.inference_mode(), torch.autocast("cuda", dtype=dtype):
                    return SearchSpec(decode).run(m, src)
            return go
        systems = {"torch bf16": run(ours, torch.bfloat16), "tensorrt fp16": run(engines, torch.float16)}
        key = "greedy" if beam == 1 else "beam4"
        out[key] = measure(systems, device, runs, s["sentences"])
        a, b = systems["torch bf16"]().tokens, systems["tensorrt fp16"]().tokens
        same = (a == b).all(dim=-1).all(dim=-1) if a.shape == b.shape else torch.zeros(1, dtype=torch.bool)
        out[key]["identical_outputs"] = round(float(same.float().mean()), 4)
        out[key]["tensorrt_vs_torch"] = round(out[key]["tensorrt fp16"]["sentences_per_s"]
                                              / out[key]["torch bf16"]["sentences_per_s"], 2)
    return out


def _lines(path: Path) -> list[str]:
    with (gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else open(path, encoding="utf-8")) as f:
        return [line.rstrip("\n") for line in f]


def multi30k(model_dir: Path, data: Path, device: torch.device, runs: int, work: Path, measure: Callable) -> dict:
    """Text level on test_2016_flickr: sentences/s and BLEU of the engines vs the bf16 model."""
    from transduce.evaluation.metrics import corpus_bleu
    from transduce.inference import load

    src, ref = _lines(data / "test_2016_flickr.en.gz"), _lines(data / "test_2016_flickr.de.gz")
    build_s = build_engines(model_dir, work / "m30_engines")
    out: dict[str, Any] = {"model_dir": str(model_dir), "sentences": len(src), "build_s": build_s}
    with load(model_dir, Runtime(device="cuda", precision="bf16")) as torch_tr, \
            load(model_dir, Runtime(device="cuda", precision="fp16", backend="tensorrt",
                                    engines=str(work / "m30_engines"))) as trt_tr:
        for beam in (1, 4):
            systems = {name: (lambda tr=tr, beam=beam: tr.translate(src, beam=beam, batch_tokens=BATCH_TOKENS))
                       for name, tr in (("torch bf16", torch_tr), ("tensorrt fp16", trt_tr))}
            key = "greedy" if beam == 1 else "beam4"
            out[key] = measure(systems, device, runs, len(src))
            hyps = {name: fn() for name, fn in systems.items()}
            bleu = {name: round(corpus_bleu(h, ref), 2) for name, h in hyps.items()}
            out[key].update(bleu=bleu, bleu_difference=round(bleu["tensorrt fp16"] - bleu["torch bf16"], 2),
                            identical_outputs=round(sum(a == b for a, b in zip(*hyps.values())) / len(src), 4),
                            tensorrt_vs_torch=round(out[key]["tensorrt fp16"]["sentences_per_s"]
                                                    / out[key]["torch bf16"]["sentences_per_s"], 2))
    return out


def tensorrt_section(device: torch.device, runs: int, model_dir: str | None, measure: Callable,
                     guarded: Callable) -> dict:
    """The section's report (see the module doc); each model guarded on its own."""
    why = why_skipped(device)
    if why is not None:
        return {"skipped": why}
    data = Path(os.environ.get("TRANSDUCE_MULTI30K", str(Path(__file__).resolve().parents[2] / "shared" / "data" /
                                                         "multi30k")))
    with tempfile.TemporaryDirectory(prefix="gpu_trt_") as tmp:
        work = Path(tmp)
        report: dict[str, Any] = {"base_random": guarded(base_random, device, runs, work, measure)}
        if model_dir is None:
            report["multi30k"] = {"skipped": "no --model-dir given"}
        elif not (data / "test_2016_flickr.en.gz").is_file():
            report["multi30k"] = {"skipped": f"no Multi30k test set at {data} (set TRANSDUCE_MULTI30K)"}
        else:
            report["multi30k"] = guarded(multi30k, Path(model_dir), data, device, runs, work, measure)
        with contextlib.suppress(Exception):
            import tensorrt
            report["tensorrt"] = tensorrt.__version__
    return report
