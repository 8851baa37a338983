"""Decoding speed: transduce vs Hugging Face ``generate`` vs CTranslate2, on one CPU process.

Every system decodes the same batch of source ids with a model of the same shape (random
weights; 3+3 layers, d_model 256, 4 heads, FFN 1024, 8k vocabulary) and is forced to produce
exactly ``--out-len`` tokens (EOS forbidden until then: our ``min_len``, HF ``min_new_tokens``,
CT2 ``min_decoding_length``), so all do the same work. Systems are interleaved, each run
``--runs`` times after a warm-up, and the median sentences/s is reported as JSON.

CTranslate2 is timed twice: as one batch on all ``--threads`` (``intra_threads``, how the
issue's targets were measured) and with ``--ct2-inter`` batches decoded at once
(``inter_threads``, the batch cut into that many sub-batches), its faster way to use a few
cores. Ours is compared with both (``vs_ct2_float32`` and ``vs_ct2_float32_interN``). Ours is
also timed the same way with ``--procs`` worker processes (:class:`~transduce.inference.SearchPool`,
``threads // procs`` threads each, the batch cut into that many parts): "transduce procsN".

By default every system lives in its own worker process, driven in turn by this one. Within
one process, CTranslate2's bundled OpenMP runtime (a second libgomp beside PyTorch's) slows
PyTorch's small ops for good once CTranslate2 has run (a 256 x 256 layer norm goes from 16 to
45 us on the 2-core benchmark machine), which would measure the co-location, not the decoder.
``--same-process`` keeps the old single-process layout for comparison.

Needs the ``bench`` extra: ``pip install 'transduce[bench]'`` (transformers, ctranslate2).

Usage:
    python bench/decode_speed.py [--sentences 64] [--src-len 20] [--out-len 32] [--threads 2]
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os
import platform
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

import torch

from transduce.config import DecodeConfig, ModelConfig
from transduce.inference import Runtime, SearchPool, SearchSpec, beam_search, greedy_search, prepare_for_decoding
from transduce.model import Transformer
from transduce.progress import progress_bar

VOCAB, PAD, BOS, EOS = 8000, 0, 1, 2
SHAPE = dict(d_model=256, n_heads=4, n_encoder_layers=3, n_decoder_layers=3, d_ff=1024)


def ours(src: torch.Tensor, out_len: int, beam: int, bf16: bool = False) -> Callable[[], int]:
    """Our beam search (greedy when beam == 1) on a random model; returns tokens produced.

    ``bf16`` runs under CPU bfloat16 autocast (reduced precision, like CT2's int8 rows).
    """
    torch.manual_seed(0)
    model = Transformer(ModelConfig(src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, dropout=0.0, **SHAPE)).eval()
    prepare_for_decoding(model, onednn=True)  # what Translator does on CPU
    decode = DecodeConfig(beam=beam, lenpen=0.6, max_len_a=0.0, max_len_b=out_len, min_len=out_len)

    def run() -> int:
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            if beam == 1:
                out = greedy_search(model, src, decode)
            else:
                out = beam_search(model, src, decode)
        return int(out.lengths.sum())
    return run


def ours_pool(src: torch.Tensor, out_len: int, beam: int, procs: int, threads: int,
              out_dir: str) -> Callable[[], int]:
    """Ours in ``procs`` worker processes, each searching one part of the batch (as CT2's
    ``inter_threads``); the same random model, saved to ``out_dir`` for the workers to load."""
    from transduce.model import save_model

    torch.manual_seed(0)
    save_model(Transformer(ModelConfig(src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, dropout=0.0, **SHAPE)), out_dir)
    pool = SearchPool(out_dir, Runtime(workers=procs, threads=max(1, threads // procs)))
    parts = list(src.split(-(-len(src) // procs)))
    spec = SearchSpec(DecodeConfig(beam=beam, lenpen=0.6, max_len_a=0.0, max_len_b=out_len, min_len=out_len))

    def run() -> int:
        return sum(int(out.lengths.sum()) for out in pool.map(parts, spec))
    return run


def marian(out_dir: str):
    """A random-weight MarianMTModel of the same shape; pad is the last id (CT2 expects it)."""
    from transformers import MarianConfig, MarianMTModel

    torch.manual_seed(0)
    pad = VOCAB - 1
    cfg = MarianConfig(vocab_size=VOCAB, d_model=SHAPE["d_model"], encoder_layers=3, decoder_layers=3,
                       encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=1024,
                       decoder_ffn_dim=1024, activation_function="relu", max_position_embeddings=512,
                       pad_token_id=pad, eos_token_id=EOS, decoder_start_token_id=pad, dropout=0.0,
                       scale_embedding=True, share_encoder_decoder_embeddings=True)
    model = MarianMTModel(cfg).eval()
    model.save_pretrained(out_dir)
    return model


def hf(model, src: torch.Tensor, out_len: int, beam: int) -> Callable[[], int]:
    mask = torch.ones_like(src)

    def run() -> int:
        with torch.inference_mode():
            out = model.generate(input_ids=src, attention_mask=mask, num_beams=beam, do_sample=False,
                                 max_new_tokens=out_len, min_new_tokens=out_len, num_return_sequences=1)
        return int((out[:, 1:] != model.config.pad_token_id).sum())
    return run


class _Vocab:
    """The little of a tokenizer that CTranslate2's Marian converter reads."""

    eos_token, unk_token, bos_token = "</s>", "<unk>", "<s>"

    def get_vocab(self) -> dict[str, int]:
        names = {BOS: "<s>", EOS: "</s>", 3: "<unk>", VOCAB - 1: "<pad>"}
        return {names.get(i, f"t{i}"): i for i in range(VOCAB)}

    def convert_ids_to_tokens(self, i: int) -> str:
        return {v: k for k, v in self.get_vocab().items()}[i]


def ct2(marian_dir: str, out_dir: str, src: torch.Tensor, out_len: int, beam: int, compute_type: str,
        threads: int, inter: int = 1) -> Callable[[], int]:
    """CTranslate2 on the converted Marian model. ``inter`` > 1 is its ``inter_threads``: the
    batch is cut into that many sub-batches (``max_batch_size``), decoded at once, each on
    ``threads // inter`` intra-op threads (its advice for throughput on CPU)."""
    import ctranslate2
    from ctranslate2.converters import TransformersConverter

    class Converter(TransformersConverter):
        def load_tokenizer(self, tokenizer_class, model_name_or_path, **kwargs):
            return _Vocab()

    model_dir = os.path.join(out_dir, "ct2")
    if not os.path.isdir(model_dir):
        Converter(marian_dir).convert(model_dir, quantization=None)
    translator = ctranslate2.Translator(model_dir, device="cpu", compute_type=compute_type,
                                        inter_threads=inter, intra_threads=max(1, threads // inter))
    max_batch_size = 0 if inter == 1 else -(-len(src) // inter)
    names = _Vocab().get_vocab()
    inverse = {i: t for t, i in names.items()}
    source = [[inverse[int(i)] for i in row] for row in src]  # ids + "</s>", as HF feeds them

    def run() -> int:
        results = translator.translate_batch(source, beam_size=beam, length_penalty=0.6,
                                             min_decoding_length=out_len, max_decoding_length=out_len,
                                             max_batch_size=max_batch_size)
        return sum(len(r.hypotheses[0]) for r in results)
    return run


def build(name: str, src: torch.Tensor, out_len: int, marian_dir: str, tmp: str,
          threads: int) -> Callable[[], int]:
    """The system called ``name`` ("transduce beam4", "ctranslate2 int8 inter2 greedy", ...)."""
    beam = 4 if name.endswith("beam4") else 1
    if name.startswith("transduce procs"):
        return ours_pool(src, out_len, beam, int(name.split()[1][len("procs"):]), threads, tmp)
    if name.startswith("transduce"):
        return ours(src, out_len, beam, bf16="bf16" in name)
    if name.startswith("hf"):
        from transformers import MarianMTModel
        return hf(MarianMTModel.from_pretrained(marian_dir).eval(), src, out_len, beam)
    compute_type = name.split()[1]
    inter = next((int(w[len("inter"):]) for w in name.split() if w.startswith("inter")), 1)
    return ct2(marian_dir, tmp, src, out_len, beam, compute_type, threads, inter)


class Worker:
    """One system in its own process: ``make(*args)`` builds it there; each call times one run
    and returns (seconds, what the run returned)."""

    def __init__(self, make: Callable[..., Callable[[], Any]], *args):
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child, make, *args), daemon=True)
        self.proc.start()

    def __call__(self) -> tuple[float, Any]:
        self.conn.send("run")
        reply = self.conn.recv()
        if isinstance(reply, str):
            raise RuntimeError(reply)
        return reply

    def close(self) -> None:
        try:
            self.conn.send("stop")
        except (BrokenPipeError, OSError):  # the worker is already gone
            pass
        self.proc.join(timeout=30)


def build_in_worker(name: str, src: torch.Tensor, out_len: int, marian_dir: str, tmp: str,
                    threads: int) -> Callable[[], int]:
    """:func:`build` in a worker process, with its thread count and scratch directory."""
    torch.set_num_threads(threads)
    return build(name, src, out_len, marian_dir, os.path.join(tmp, name.replace(" ", "_")), threads)


def _serve(conn, make: Callable[..., Callable[[], Any]], *args) -> None:
    try:
        run = make(*args)
    except Exception as e:  # reported to the parent at its first request
        run, error = None, f"{args[0] if args else make.__name__}: {type(e).__name__}: {e}"
    while conn.recv() == "run":
        if run is None:
            conn.send(error)
            continue
        start = time.perf_counter()
        produced = run()
        conn.send((time.perf_counter() - start, produced))


def timed(run: Callable[[], int]) -> Callable[[], tuple[float, int]]:
    """An in-process system with the worker's interface."""
    def call() -> tuple[float, int]:
        start = time.perf_counter()
        produced = run()
        return time.perf_counter() - start, produced
    return call


def measure(systems: dict[str, Callable[[], tuple[float, int]]], runs: int, expected_tokens: int,
            settle: float = 1.0) -> dict[str, dict]:
    """Warm up each system, then ``runs`` interleaved timed rounds; medians in sentences/s.

    Each timed run starts ``settle`` seconds after the previous one ended: an OpenMP runtime
    keeps its worker threads spinning for a while after a parallel region (Intel's
    ``KMP_BLOCKTIME`` is 200 ms, GNU's spin count similar), and on a 2-core machine the
    previous system's spinning threads would otherwise take the cores from the next one.
    """
    times: dict[str, list[float]] = {name: [] for name in systems}
    for name, run in systems.items():
        _, produced = run()
        if produced != expected_tokens:
            raise RuntimeError(f"{name} produced {produced} tokens, expected {expected_tokens}")
    with progress_bar(runs * len(systems), unit="runs", desc="timing") as bar:  # stderr: the JSON goes to stdout
        for _ in range(runs):
            for name, run in systems.items():
                time.sleep(settle)
                times[name].append(run()[0])
                bar.update()
    return {name: {"median_s": statistics.median(t), "runs_s": [round(x, 4) for x in t]}
            for name, t in times.items()}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sentences", type=int, default=64)
    p.add_argument("--src-len", type=int, default=20)
    p.add_argument("--out-len", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--runs", type=int, default=4)
    p.add_argument("--settle", type=float, default=1.0,
                   help="seconds of idle before each timed run (lets spinning OpenMP threads sleep)")
    p.add_argument("--systems", default="ours,hf,ct2", help="comma-separated subset of ours,hf,ct2")
    p.add_argument("--bf16", action="store_true", help="also time ours under CPU bfloat16 autocast")
    p.add_argument("--ct2-inter", type=int, default=2,
                   help="also time CTranslate2 with this many inter_threads (batches at once; 1: skip)")
    p.add_argument("--procs", type=int, default=2,
                   help="also time ours in this many worker processes, one part of the batch each (0: skip)")
    p.add_argument("--same-process", action="store_true",
                   help="run every system in this process (see the module doc for why that is not the default)")
    return p.parse_args(argv)


def system_names(args: argparse.Namespace) -> list[str]:
    """Every system the command line asks for, beam 4 first, then greedy."""
    chosen = args.systems.split(",")
    names = []
    for label in ("beam4", "greedy"):
        if "ours" in chosen:
            names.append(f"transduce {label}")
            if args.procs > 0:
                names.append(f"transduce procs{args.procs} {label}")
            if args.bf16:
                names.append(f"transduce bf16-autocast {label}")
        if "hf" in chosen:
            names.append(f"hf generate {label}")
        if "ct2" in chosen:
            names += [f"ctranslate2 {ct} {label}" for ct in ("float32", "int8")]
            if args.ct2_inter > 1:
                names += [f"ctranslate2 {ct} inter{args.ct2_inter} {label}" for ct in ("float32", "int8")]
    return names


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, VOCAB - 1, (args.sentences, args.src_len + 1), generator=g)
    src[:, -1] = EOS
    chosen, names = args.systems.split(","), system_names(args)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        marian_dir = os.path.join(tmp, "marian")
        if "hf" in chosen or "ct2" in chosen:
            marian(marian_dir)
        workers = []
        if args.same_process:
            systems = {n: timed(build(n, src, args.out_len, marian_dir, os.path.join(tmp, n.replace(" ", "_")),
                                      args.threads)) for n in names}
        else:
            # A pool of processes cannot live in a (daemonic) worker; it is driven from here.
            systems = {}
            for n in names:
                if "procs" in n:
                    systems[n] = timed(build(n, src, args.out_len, marian_dir,
                                             os.path.join(tmp, n.replace(" ", "_")), args.threads))
                else:
                    workers.append(Worker(build_in_worker, n, src, args.out_len, marian_dir, tmp, args.threads))
                    systems[n] = workers[-1]
        try:
            results = measure(systems, args.runs, args.sentences * args.out_len, args.settle)
        finally:
            for w in workers:
                w.close()
    for r in results.values():
        r["sentences_per_s"] = round(args.sentences / r["median_s"], 1)
    for label in ("beam4", "greedy"):  # the targets are stated against CTranslate2 float32
        base = results.get(f"ctranslate2 float32 {label}")
        inter = results.get(f"ctranslate2 float32 inter{args.ct2_inter} {label}")
        for name, r in results.items():
            if base and name.endswith(label):
                r["vs_ct2_float32"] = round(base["median_s"] / r["median_s"], 2)
            if inter and name.endswith(label):  # against CT2 float32 with batches in parallel
                r[f"vs_ct2_float32_inter{args.ct2_inter}"] = round(inter["median_s"] / r["median_s"], 2)
    report = {
        "date": datetime.date.today().isoformat(), "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(), "threads": args.threads, "torch": torch.__version__,
        "python": sys.version.split()[0], "sentences": args.sentences, "src_len": args.src_len,
        "out_len": args.out_len, "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "(default)"),
        "settle_s": args.settle, "ct2_inter_threads": args.ct2_inter,
        "isolation": "same process" if args.same_process else "one worker process per system",
        "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)], "results": results,
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
