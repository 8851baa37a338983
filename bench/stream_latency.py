"""Streaming and document splitting, side by side in one process; prints one JSON object.

1. First streamed text vs the whole translation: for each sentence of ``--input`` (or the toy
   sentences below), the seconds until :func:`~transduce.inference.streaming.stream_translation`
   emits its first delta, and until the plain ``Translator.translate`` of the same sentence
   returns (median over sentences; greedy and beam 4).
2. The sentence splitters considered for ``translate --documents``: sentencex vs pysbd on the same
   text (seconds, ratio), when both are installed.

Usage:
    python bench/stream_latency.py --model runs/demo/model [--input sentences.txt] [--beam 1 4]
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import time

import torch

SENTENCES = ["the red dog runs over the old house today", "a small cat sleeps under the big green tree",
             "the young bird sings near the blue river", "an old dog eats the red bird today"]


def first_vs_full(translator, sentences: list[str], beam: int) -> dict:
    from transduce.inference.streaming import stream_translation

    first, full = [], []
    for s in sentences:
        start, seen = time.perf_counter(), []
        stream_translation(translator, s, lambda d: seen or seen.append(time.perf_counter() - start), beam=beam)
        first.append(seen[0] if seen else float("nan"))
        start = time.perf_counter()
        translator.translate([s], beam=beam)
        full.append(time.perf_counter() - start)
    f, w = statistics.median(first), statistics.median(full)
    return {"beam": beam, "first_delta_s": round(f, 5), "full_translation_s": round(w, 5), "ratio": round(f / w, 3)}


def splitters(text: str) -> dict | None:
    try:
        import pysbd
        import sentencex
    except ImportError:
        return None
    start = time.perf_counter()
    n_x = len(list(sentencex.segment("en", text)))
    t_x = time.perf_counter() - start
    start = time.perf_counter()
    n_p = len(pysbd.Segmenter(language="en", clean=False).segment(text))
    t_p = time.perf_counter() - start
    return {"chars": len(text), "sentencex_s": round(t_x, 4), "pysbd_s": round(t_p, 4),
            "pysbd_over_sentencex": round(t_p / t_x, 1), "sentences": {"sentencex": n_x, "pysbd": n_p}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="a translation model directory")
    p.add_argument("--input", default=None, help="sentences, one a line (default: a few toy sentences)")
    p.add_argument("--beam", type=int, nargs="+", default=[1, 4])
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    from transduce.inference import Translator

    sentences = SENTENCES if args.input is None else open(args.input, encoding="utf-8").read().splitlines()
    with Translator.load(args.model) as tr:
        tr.translate(sentences[:2])  # warm-up
        stream = [first_vs_full(tr, sentences, b) for b in args.beam]
    doc = " ".join(f"Dr. Smith paid $3.{i:02d} for it. He said \"Stop.\" The U.S. grew 2.5% in Q{i % 4 + 1}!"
                   for i in range(300))
    print(json.dumps({"stream": stream, "splitters": splitters(doc), "sentences": len(sentences),
                      "threads": args.threads, "machine": platform.machine(), "torch": torch.__version__,
                      "date": datetime.date.today().isoformat()}, indent=1))


if __name__ == "__main__":
    main()
