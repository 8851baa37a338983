"""Translation speed and BLEU of the shipped runtimes: eager float32 / dynamic int8 / static int8
(``transduce quantize``, and of a ``train.qat`` model), the compiled greedy step
(``eager_compiled``: ``--compile``, ``runtime.compile``), ONNX Runtime, CTranslate2.

Every system translates the same sentences with greedy search, or beam search with ``--beam``,
and the same thread count, after a warm-up (for ``eager_compiled``, a whole run first: it
compiles for the batch shapes it meets; its seconds are ``warmup_s``); the script prints
one JSON object with sentences/s, the size on disk of what each system loads, and, when
references exist, BLEU and its change from eager float32. The static int8 model is calibrated
on 200 other toy sentences (or ``--calibrate``); ``--qat DIR`` names a model fine-tuned with
``train.qat: true`` from ``--model``, quantised by the scales its run observed (``eager_qat_int8``).

With ``--model DIR`` (a trained model directory, e.g. ``runs/demo/model`` from ``transduce
demo``) the sentences are the toy corpus generator's (``transduce.data.toy``, a fixed seed,
the demo's domain) with references. Without it, a fixed random-weight model of the demo's shape
(``--shape toy``: the test suite's toy model's) is used on the same sentences and every system
is forced to produce ``--out-len`` tokens (EOS
forbidden until then), so all do the same work; BLEU is then meaningless and omitted.

Needs the ``export`` extra. Usage:
    python bench/export_speed.py [--model runs/demo/model] [--sentences 1000] [--threads 1] [--beam 4]
        [--qat QAT_MODEL] [--systems eager_fp32,eager_int8,eager_static_int8,...]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from transduce.data.tokenizer import Tokenizer
from transduce.data.toy import generate_pairs
from transduce.interop import export_model
from transduce.inference import Runtime, Translator
from transduce.model.io import load_model_config

SEED = 20240601  # the sentences: toy pairs never drawn by the demo's own splits (seed 0)
CALIBRATION_SEED = 20240602  # the static int8 models' calibration sample (200 other toy sentences)


# The random model's shapes: the demo's, and the test suite's toy model (tests/toy_model.py).
SHAPES = {"demo": dict(d_ff=512), "toy": dict(d_model=64, n_encoder_layers=1, n_decoder_layers=2, d_ff=128)}


def model_arguments(ap: argparse.ArgumentParser) -> None:
    """The options naming what a side-by-side script decodes: a trained ``--model`` and its
    ``--src`` sentences, or a random model of ``--shape`` on toy sentences, forced to ``--out-len``."""
    ap.add_argument("--model", default=None, help="trained model directory (default: a random one of --shape)")
    ap.add_argument("--src", default=None, help="source sentences, one a line (default: toy sentences)")
    ap.add_argument("--shape", default="demo", choices=sorted(SHAPES))
    ap.add_argument("--sentences", type=int, default=1000)
    ap.add_argument("--out-len", type=int, default=32, help="forced output length for the random model")


def source_texts(args: argparse.Namespace) -> list[str]:
    """The first ``args.sentences`` lines of ``args.src``, or as many toy sentences (:data:`SEED`)."""
    texts = (Path(args.src).read_text(encoding="utf-8").splitlines() if args.src
             else [s for s, _ in generate_pairs(args.sentences, SEED)])
    return texts[:args.sentences]


def random_model_dir(out: Path, sentences: list[str], shape: str = "demo") -> Path:
    """A fixed random-weight model of ``shape`` (:data:`SHAPES`) with a tokenizer trained on ``sentences``."""
    from transduce.config import model_preset
    from transduce.model import Transformer, save_model

    tok = Tokenizer.train(sentences, sentences, out, vocab_size=1000)
    torch.manual_seed(0)
    cfg = model_preset("tiny", src_vocab_size=tok.src_vocab_size, tgt_vocab_size=tok.tgt_vocab_size,
                       dropout=0.0, max_positions=256, **SHAPES[shape])
    save_model(Transformer(cfg).eval(), out)
    return out


def timed(fn, warmup: list[str], texts: list[str], runs: int = 1) -> tuple[list[str], float]:
    """The outputs, and the median seconds of ``runs`` timed runs after a warm-up."""
    fn(warmup)
    seconds = []
    for _ in range(runs):
        start = time.perf_counter()
        out = fn(texts)
        seconds.append(time.perf_counter() - start)
    return out, float(np.median(seconds))


def eager(model_dir: Path, int8: bool, out_len: int | None, batch_tokens: int, beam: int = 1,
          runtime: Runtime | None = None):
    """transduce's Translator (eager PyTorch, or ``runtime``'s backend: the ONNX graphs)."""
    tr = Translator.load(model_dir, runtime or Runtime(device="cpu", int8=int8))

    def run(texts: list[str]) -> list[str]:
        if out_len is None:
            return tr.translate(texts, beam=beam, batch_tokens=batch_tokens)
        return tr.translate(texts, beam=beam, max_len_a=0.0, max_len_b=out_len, min_len=out_len,
                            batch_tokens=batch_tokens)
    return run


def static_int8_dir(model_dir: Path, out: Path, calibration: str | None) -> Path:
    """``transduce quantize`` of ``model_dir`` into ``out``, calibrated on ``calibration`` (a file)
    or on 200 other toy sentences."""
    from transduce.inference.quantize import quantize_directory

    sample = Path(calibration) if calibration else out.parent / "calibration.en"
    if not calibration:
        sample.parent.mkdir(parents=True, exist_ok=True)
        sample.write_text("\n".join(s for s, _ in generate_pairs(200, CALIBRATION_SEED)) + "\n", encoding="utf-8")
    quantize_directory(str(model_dir), str(sample), str(out))
    return out


# The files that hold a system's model, by format: safetensors (transduce, static int8), CTranslate2's
# model.bin, ONNX graphs (and their external data, :func:`model_files`), TensorRT engines.
MODEL_SUFFIXES = (".safetensors", ".bin", ".onnx", ".plan")


def model_files(path: Path) -> list[Path]:
    """The model files of a system's directory (and below it: a Triton repository's versions),
    not its configs or vocabularies; an ONNX graph's external data files included, whatever their name."""
    files = {f for f in path.rglob("*") if f.is_file() and f.suffix in MODEL_SUFFIXES}
    for graph in [f for f in files if f.suffix == ".onnx"]:
        files |= {graph.parent / name for name in onnx_external_data(graph)}
    return sorted(files)


def onnx_external_data(graph: Path) -> set[str]:
    """The files (relative to ``graph``'s directory) that hold the ONNX graph's external tensors."""
    import onnx
    from onnx.external_data_helper import uses_external_data

    model = onnx.load(str(graph), load_external_data=False)
    return {entry.value for t in model.graph.initializer if uses_external_data(t)
            for entry in t.external_data if entry.key == "location"}


def disk_mb(path: Path) -> float:
    """Size on disk of the model a system loads: its :func:`model_files`, in MiB."""
    return round(sum(f.stat().st_size for f in model_files(path)) / 2**20, 2)


def ctranslate2_runtime(ct2_dir: Path, tok: Tokenizer, threads: int, out_len: int | None, batch_size: int,
                        beam: int = 1, max_positions: int = 1024):
    import ctranslate2

    translator = ctranslate2.Translator(str(ct2_dir), device="cpu", intra_threads=threads, inter_threads=1)

    def run(texts: list[str]) -> list[str]:
        pieces = [tok.pieces(tok.encode(t, "src"), "src") for t in texts]
        max_len = out_len if out_len is not None else min(max(len(p) for p in pieces) + 51, max_positions - 1)
        results = translator.translate_batch(
            pieces, beam_size=beam, max_batch_size=batch_size, batch_type="examples", max_decoding_length=max_len,
            min_decoding_length=out_len or 0, suppress_sequences=[["<pad>"], ["<s>"]])
        return [tok._side("tgt").decode(r.hypotheses[0]) for r in results]
    return run


def bleu(hyps: list[str], refs: list[str]) -> float:
    import sacrebleu

    return round(sacrebleu.corpus_bleu(hyps, [refs]).score, 2)


def machine() -> str:
    """CPU model and count, e.g. "AMD EPYC 7B13, 2 CPUs, Linux"."""
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            name = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{name}, {os.cpu_count()} CPUs, {platform.system()}"


def system(name: str, model_dir: Path, tmp: Path, tok: Tokenizer, args, out_len: int | None,
           batch_tokens: int):
    """(the directory system ``name`` loads, a function building its runner)."""
    if name in ("eager_fp32", "eager_int8"):
        return model_dir, lambda: eager(model_dir, name == "eager_int8", out_len, batch_tokens, args.beam)
    if name == "eager_compiled":
        return model_dir, lambda: eager(model_dir, False, out_len, batch_tokens, args.beam,
                                        Runtime(device="cpu", compile=True))
    if name in ("eager_static_int8", "eager_qat_int8"):
        if name == "eager_qat_int8" and args.qat is None:
            raise SystemExit("eager_qat_int8: give the train.qat model directory with --qat")
        if name == "eager_static_int8":
            quantized = static_int8_dir(model_dir, tmp / name / "model", args.calibrate)
        else:  # the QAT run's own scales (transduce quantize without a sample)
            from transduce.inference.quantize import quantize_directory
            quantized = tmp / name / "model"
            quantize_directory(args.qat, None, str(quantized))
        return quantized, lambda: eager(quantized, False, out_len, batch_tokens, args.beam)
    if name == "onnxruntime":  # transduce's own search over the graphs (--backend onnx)
        out = export_model(model_dir, "onnx", tmp / "onnx").out
        runtime = Runtime(device="cpu", backend="onnx", engines=str(out), threads=args.threads)
        return out, lambda: eager(model_dir, False, out_len, batch_tokens, args.beam, runtime)
    if name in ("ct2_fp32", "ct2_int8"):
        quantization = "int8" if name == "ct2_int8" else None
        out = export_model(model_dir, "ctranslate2", tmp / name, quantization=quantization).out
        positions = load_model_config(model_dir).max_positions  # CT2 has no position past the model's
        return out, lambda: ctranslate2_runtime(out, tok, args.threads, out_len, args.batch_size, args.beam,
                                                positions)
    raise SystemExit(f"--systems: unknown system {name!r}")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="trained model directory (default: runs/demo/model if present)")
    ap.add_argument("--sentences", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=1,
                    help="threads per system (more threads are slower on a busy 2-core machine)")
    ap.add_argument("--batch-size", type=int, default=64,
                    help="sentences per batch for CTranslate2 (the others: batches of as many tokens)")
    ap.add_argument("--out-len", type=int, default=32, help="forced output length for the random model")
    ap.add_argument("--shape", default="demo", choices=sorted(SHAPES),
                    help="the random model's shape (without --model): the demo's or the toy model's")
    ap.add_argument("--systems", default="eager_fp32,eager_int8,onnxruntime,ct2_fp32,ct2_int8",
                    help="comma-separated; also eager_static_int8, and eager_qat_int8 with --qat")
    ap.add_argument("--runs", type=int, default=1, help="timed runs per system; the median is reported")
    ap.add_argument("--beam", type=int, default=1, help="beam size (1: greedy)")
    ap.add_argument("--qat", default=None, help="a train.qat model directory fine-tuned from --model")
    ap.add_argument("--src", default=None, help="test sources, one a line (default: toy sentences)")
    ap.add_argument("--ref", default=None, help="their references (with --src); also the static int8 "
                    "models' calibration sample comes from --calibrate")
    ap.add_argument("--calibrate", default=None, help="calibration sources for the static int8 models")
    return ap.parse_args()


def main() -> int:
    args = parse_args()
    torch.set_num_threads(args.threads)
    if args.src:
        texts = Path(args.src).read_text(encoding="utf-8").splitlines()[:args.sentences]
        refs = Path(args.ref).read_text(encoding="utf-8").splitlines()[:args.sentences]
    else:
        pairs = generate_pairs(args.sentences, SEED)
        texts, refs = [s for s, _ in pairs], [t for _, t in pairs]
    model = args.model or ("runs/demo/model" if Path("runs/demo/model/config.yaml").is_file() else None)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model_dir = Path(model) if model else random_model_dir(tmp / "random", texts, args.shape)
        out_len = None if model else args.out_len
        tok = Tokenizer.load(model_dir)
        # eager batches hold about batch_size sentences of average length, like the others
        batch_tokens = int(args.batch_size * np.mean([len(tok.encode(t, "src")) + 1 for t in texts]))
        results, outputs = {}, {}
        for name in args.systems.split(","):
            loaded, make = system(name, model_dir, tmp, tok, args, out_len, batch_tokens)
            run, start = make(), time.perf_counter()
            if name == "eager_compiled":  # (compiles for the batch shapes of the run)
                run(texts)
            warmup = time.perf_counter() - start
            outputs[name], seconds = timed(run, texts[:32], texts, args.runs)
            results[name] = {"sentences_per_s": round(len(texts) / seconds, 1), "seconds": round(seconds, 2),
                             "disk_mb": disk_mb(loaded)}
            if name == "eager_compiled":
                results[name]["warmup_s"] = round(warmup, 1)
            if model:
                results[name]["bleu"] = bleu(outputs[name], refs)
            print(f"{name}: {results[name]}", file=sys.stderr)
        if model and "eager_fp32" in results:
            base = results["eager_fp32"]["bleu"]
            for name, r in results.items():
                r["bleu_change"] = round(r["bleu"] - base, 2)
                r["same_output_as_eager_fp32"] = round(
                    float(np.mean([a == b for a, b in zip(outputs[name], outputs["eager_fp32"])])), 3)
    print(json.dumps({
        "benchmark": "export_speed", "date": datetime.date.today().isoformat(),
        "machine": machine(),
        "torch": torch.__version__, "threads": args.threads, "runs": args.runs,
        "model": model or f"random ({args.shape} shape), forced length",
        "sentences": len(texts), "search": "greedy" if args.beam == 1 else f"beam {args.beam}",
        "batch_size": args.batch_size, "results": results,
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
