"""Translation speed on real text: transduce (one process, worker processes) vs CTranslate2.

A trained model directory and a source file: every system translates all its lines with the
same beam search, BLEU against ``--ref`` when given. The default search, length penalty 0 and
our ``stop="best_finished"``, is the one under which our beam search and CTranslate2's return
the same hypotheses (``transduce export`` verifies it), so the systems do the same work; the
report gives each system's share of outputs identical to ours.

Systems: ours in one process on ``--threads`` threads; ours in ``--workers`` worker processes
(:class:`~transduce.inference.TranslatorPool`, ``threads // workers`` threads each);
CTranslate2 (the model exported by ``transduce export --format ctranslate2``) float32 as one
stream of batches on ``--threads`` intra-op threads, and with ``inter_threads=--workers``
(batches decoded at once, ``threads // workers`` threads each); CTranslate2 int8 the same way
(reduced precision). Each system but the pool lives in its own worker process (see
``decode_speed.py`` for why); systems are interleaved, the median of ``--runs`` after a warm-up.

Needs the ``bench`` extra. Usage:
    python bench/translate_speed.py MODEL_DIR --src test.en [--ref test.de] [--beam 5] [--threads 2]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

import torch

from decode_speed import Worker, timed  # bench/ is the script's directory, so on sys.path
from transduce.data.corpus import read_lines
from transduce.inference import Runtime, Translator, TranslatorPool
from transduce.progress import progress_bar


def ours(model_dir: str, texts: list[str], search: dict, threads: int) -> Callable[[], list[str]]:
    torch.set_num_threads(threads)
    translator = Translator.load(model_dir, Runtime(device="cpu"))
    return lambda: translator.translate(texts, **search)


def ours_pool(model_dir: str, texts: list[str], search: dict, workers: int, threads: int) -> Callable[[], list[str]]:
    pool = TranslatorPool.load(model_dir, Runtime(workers=workers, threads=max(1, threads // workers)))
    return lambda: pool.translate(texts, **search)


def ctranslate2_system(model_dir: str, ct2_dir: str, texts: list[str], search: dict, compute_type: str,
                       threads: int, inter: int) -> Callable[[], list[str]]:
    """CTranslate2 on the exported model, same search; ``inter`` batches decoded at once."""
    import ctranslate2

    from transduce.data.tokenizer import Tokenizer

    tok = Tokenizer.load(model_dir)
    translator = ctranslate2.Translator(ct2_dir, device="cpu", compute_type=compute_type, inter_threads=inter,
                                        intra_threads=max(1, threads // inter))
    pieces = [tok.pieces(tok.encode(t, "src"), "src") for t in texts]
    todo = [i for i, p in enumerate(pieces) if p]
    limit = max((len(pieces[i]) for i in todo), default=0) + 1 + search["max_len_b"]  # ours: source + EOS + 50

    def run() -> list[str]:
        results = translator.translate_batch(
            [pieces[i] for i in todo], beam_size=search["beam"], length_penalty=search["lenpen"],
            max_batch_size=search["batch_tokens"], batch_type="tokens", max_decoding_length=limit,
            suppress_sequences=[["<pad>"], ["<s>"]])
        out = [""] * len(texts)
        for i, r in zip(todo, results):
            out[i] = tok._side("tgt").decode(r.hypotheses[0])
        return out
    return run


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model_dir")
    p.add_argument("--src", required=True, help="source sentences, one per line")
    p.add_argument("--ref", default=None, help="references, for BLEU")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--batch-tokens", type=int, default=4096)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--workers", type=int, default=2, help="our worker processes and CT2's inter_threads")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--settle", type=float, default=1.0, help="seconds of idle before each timed run")
    return p.parse_args(argv)


def scores(times: dict[str, list[float]], outputs: dict[str, list[str]], refs: list[str] | None, n: int,
           workers: int) -> dict[str, dict[str, Any]]:
    """Sentences/s (median run), the share of outputs identical to ours, BLEU with references, and
    each system's speed over three peers'."""
    results = {}
    for name, ts in times.items():
        median = statistics.median(ts)
        out = outputs[name]
        r = {"sentences_per_s": round(n / median, 1), "runs_s": [round(x, 3) for x in ts],
             "identical_to_transduce": round(sum(a == b for a, b in zip(out, outputs["transduce"])) / n, 4)}
        if refs is not None:
            import sacrebleu
            r["bleu"] = round(sacrebleu.corpus_bleu(out, [refs]).score, 2)
        results[name] = r
    for name, r in results.items():
        for peer in ("transduce", "ctranslate2 float32", f"ctranslate2 float32 inter{workers}"):
            r[f"vs_{peer.replace(' ', '_')}"] = round(r["sentences_per_s"] / results[peer]["sentences_per_s"], 2)
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    texts = list(read_lines(args.src))
    refs = list(read_lines(args.ref)) if args.ref else None
    search = dict(beam=args.beam, lenpen=0.0, stop="best_finished", max_len_a=1.0, max_len_b=50,
                  batch_tokens=args.batch_tokens)
    ct2_search = {k: v for k, v in search.items() if k != "stop"}
    w, t = args.workers, args.threads
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        from transduce.interop import export_model

        ct2_dir = os.path.join(tmp, "ct2")
        export_model(args.model_dir, "ctranslate2", ct2_dir)
        workers = {
            "transduce": Worker(ours, args.model_dir, texts, search, t),
            "ctranslate2 float32": Worker(ctranslate2_system, args.model_dir, ct2_dir, texts, ct2_search,
                                          "float32", t, 1),
            f"ctranslate2 float32 inter{w}": Worker(ctranslate2_system, args.model_dir, ct2_dir, texts, ct2_search,
                                                   "float32", t, w),
            f"ctranslate2 int8 inter{w}": Worker(ctranslate2_system, args.model_dir, ct2_dir, texts, ct2_search,
                                                "int8", t, w),
        }
        systems: dict[str, Callable[[], tuple[float, Any]]] = dict(workers)
        # A pool of processes cannot live in a (daemonic) worker; it is driven from here.
        systems[f"transduce workers{w}"] = timed(ours_pool(args.model_dir, texts, search, w, t))
        try:
            outputs = {name: run()[1] for name, run in systems.items()}  # warm-up, and the outputs
            times: dict[str, list[float]] = {name: [] for name in systems}
            with progress_bar(args.runs * len(systems), unit="runs", desc="timing") as bar:  # stderr: JSON to stdout
                for _ in range(args.runs):
                    for name, run in systems.items():
                        time.sleep(args.settle)
                        times[name].append(run()[0])
                        bar.update()
        finally:
            for worker in workers.values():
                worker.close()
    results = scores(times, outputs, refs, len(texts), w)
    print(json.dumps({
        "date": datetime.date.today().isoformat(), "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(), "threads": t, "workers": w, "torch": torch.__version__,
        "python": sys.version.split()[0], "model": os.path.abspath(args.model_dir), "src": args.src,
        "sentences": len(texts), "search": search,
        "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)], "results": results,
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
