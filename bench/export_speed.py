"""Translation speed and BLEU of the shipped runtimes: eager float32 / int8, ONNX Runtime, CTranslate2.

Every system translates the same sentences with greedy search (the ONNX runner is greedy only)
and the same thread count, after a warm-up; the script prints one JSON object with
sentences/s, and, when references exist, BLEU and its change from eager float32.

With ``--model DIR`` (a trained model directory, e.g. ``runs/demo/model`` from ``transduce
demo``) the sentences are the toy corpus generator's (``transduce.data.toy``, a fixed seed,
the demo's domain) with references. Without it, a fixed random-weight model of the demo's shape
is used on the same sentences and every system is forced to produce ``--out-len`` tokens (EOS
forbidden until then), so all do the same work; BLEU is then meaningless and omitted.

Needs the ``export`` extra. Usage:
    python bench/export_speed.py [--model runs/demo/model] [--sentences 1000] [--threads 1]
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
from transduce.export import export_model
from transduce.inference import Runtime, Translator

SEED = 20240601  # the sentences: toy pairs never drawn by the demo's own splits (seed 0)


def random_model_dir(out: Path, sentences: list[str]) -> Path:
    """A fixed random-weight model in the demo's shape with a tokenizer trained on ``sentences``."""
    from transduce.config import model_preset
    from transduce.model import Transformer, save_model

    tok = Tokenizer.train(sentences, sentences, out, vocab_size=1000)
    torch.manual_seed(0)
    cfg = model_preset("tiny", src_vocab_size=tok.src_vocab_size, tgt_vocab_size=tok.tgt_vocab_size,
                       d_ff=512, dropout=0.0, max_positions=256)
    save_model(Transformer(cfg).eval(), out)
    return out


def timed(fn, warmup: list[str], texts: list[str]) -> tuple[list[str], float]:
    fn(warmup)
    start = time.perf_counter()
    out = fn(texts)
    return out, time.perf_counter() - start


def eager(model_dir: Path, int8: bool, out_len: int | None, batch_tokens: int):
    tr = Translator.load(model_dir, Runtime(device="cpu", int8=int8))

    def run(texts: list[str]) -> list[str]:
        if out_len is None:
            return tr.translate(texts, beam=1, batch_tokens=batch_tokens)
        res = tr.translate_detailed(texts, beam=1, max_len_a=0.0, max_len_b=out_len, min_len=out_len,
                                    batch_tokens=batch_tokens)
        return [r.best.text for r in res]
    return run


def batches(rows: list[list[int]], size: int):
    """Length-sorted batches of row indices (what every runtime gets)."""
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
    for k in range(0, len(order), size):
        yield order[k: k + size]


def onnx_runtime(onnx_dir: Path, tok: Tokenizer, threads: int, out_len: int | None, batch_size: int):
    from transduce.export.onnx_export import OnnxGreedy

    runner = OnnxGreedy(onnx_dir, threads=threads)

    def run(texts: list[str]) -> list[str]:
        rows = [tok.encode(t, "src") + [2] for t in texts]
        out = [""] * len(texts)
        for index in batches(rows, batch_size):
            width = max(len(rows[i]) for i in index)
            src = np.array([rows[i] + [0] * (width - len(rows[i])) for i in index], dtype=np.int64)
            max_len = out_len if out_len is not None else width + 50
            for i, ids in zip(index, runner.greedy(src, max_len, min_len=out_len or 0)):
                out[i] = tok.decode(ids, "tgt")
        return out
    return run


def ctranslate2_runtime(ct2_dir: Path, tok: Tokenizer, threads: int, out_len: int | None, batch_size: int):
    import ctranslate2

    translator = ctranslate2.Translator(str(ct2_dir), device="cpu", intra_threads=threads, inter_threads=1)

    def run(texts: list[str]) -> list[str]:
        pieces = [tok.pieces(tok.encode(t, "src"), "src") for t in texts]
        max_len = out_len if out_len is not None else max(len(p) for p in pieces) + 51
        results = translator.translate_batch(
            pieces, beam_size=1, max_batch_size=batch_size, batch_type="examples", max_decoding_length=max_len,
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="trained model directory (default: runs/demo/model if present)")
    ap.add_argument("--sentences", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=1,
                    help="threads per system (more threads are slower on a busy 2-core machine)")
    ap.add_argument("--batch-size", type=int, default=64, help="sentences per batch for ONNX / CTranslate2")
    ap.add_argument("--out-len", type=int, default=32, help="forced output length for the random model")
    ap.add_argument("--systems", default="eager_fp32,eager_int8,onnxruntime,ct2_fp32,ct2_int8")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    pairs = generate_pairs(args.sentences, SEED)
    texts, refs = [s for s, _ in pairs], [t for _, t in pairs]
    model = args.model or ("runs/demo/model" if Path("runs/demo/model/config.yaml").is_file() else None)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model_dir = Path(model) if model else random_model_dir(tmp / "random", texts)
        out_len = None if model else args.out_len
        tok = Tokenizer.load(model_dir)
        # eager batches hold about batch_size sentences of average length, like the others
        batch_tokens = int(args.batch_size * np.mean([len(tok.encode(t, "src")) + 1 for t in texts]))
        systems = {
            "eager_fp32": lambda: eager(model_dir, False, out_len, batch_tokens),
            "eager_int8": lambda: eager(model_dir, True, out_len, batch_tokens),
            "onnxruntime": lambda: onnx_runtime(export_model(model_dir, "onnx", tmp / "onnx").out, tok,
                                                args.threads, out_len, args.batch_size),
            "ct2_fp32": lambda: ctranslate2_runtime(export_model(model_dir, "ctranslate2", tmp / "ct2").out, tok,
                                                    args.threads, out_len, args.batch_size),
            "ct2_int8": lambda: ctranslate2_runtime(
                export_model(model_dir, "ctranslate2", tmp / "ct2_int8", quantization="int8").out, tok,
                args.threads, out_len, args.batch_size),
        }
        results, outputs = {}, {}
        for name in args.systems.split(","):
            outputs[name], seconds = timed(systems[name](), texts[:32], texts)
            results[name] = {"sentences_per_s": round(len(texts) / seconds, 1), "seconds": round(seconds, 2)}
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
        "torch": torch.__version__, "threads": args.threads, "model": model or "random (demo shape), forced length",
        "sentences": len(texts), "search": "greedy", "batch_size": args.batch_size, "results": results,
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
