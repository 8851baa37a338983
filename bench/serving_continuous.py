"""Continuous batching vs request-level batching under Poisson arrivals, in one process.

Sentences arrive one at a time at exponential intervals (``--rates``, sentences per second, a
seeded schedule, ``--seconds`` of arrivals each) and are translated by each engine behind the
same front (a submit that returns a future, answered from one decode thread):

* ``continuous``: :class:`transduce.inference.engine.ContinuousTranslator`, each sentence joining
  the running batch at the next decoding step;
* ``request``: the server's :class:`transduce.serve.batcher.DynamicBatcher` over
  ``Translator.translate`` (requests gathered for ``--wait-ms``, the batch run to its end);
* ``ctranslate2`` (with ``--ct2 DIR``, a converted model, and the ``ctranslate2`` package): the
  same batcher over ``ctranslate2.Translator.translate_batch`` on the tokenizer's pieces.

For each engine and rate: sentences/s (answered over the time from the first arrival to the last
answer), p50 and p99 latency (arrival to answer, ms). Prints one JSON object. ``--model DIR``: a
trained model (default: a random-weight model of the test toy's shape, whose outputs run to
their length limit). ``--dry``: two rates, 2 s each, outputs of 8 tokens at most (< 30 s).

Usage:
    python bench/serving_continuous.py --model runs/demo/model --rates 2,8,32,64 --seconds 30 --beam 4
    python bench/serving_continuous.py --dry
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

from transduce.data.toy import generate_pairs
from transduce.inference import Runtime, Translator
from transduce.inference.engine import ContinuousTranslator
from transduce.serve.batcher import DynamicBatcher

SEED = 20240605  # the arrival schedules and the toy sentences


def arrivals(rate: float, seconds: float, seed: int) -> list[float]:
    """Poisson arrival times (s) over ``seconds`` at ``rate`` per second."""
    rng, t, out = random.Random(seed), 0.0, []
    while True:
        t += rng.expovariate(rate)
        if t >= seconds:
            return out
        out.append(t)


def drive(submit, texts: list[str], times: list[float]) -> dict:
    """Submit ``texts[i]`` at ``times[i]`` (a future each); sentences/s and latency percentiles."""
    done, lock, latencies = threading.Event(), threading.Lock(), []
    start = time.perf_counter()

    def answered(arrived: float):
        def record(_future) -> None:
            with lock:
                latencies.append(time.perf_counter() - arrived)
                if len(latencies) == len(times):
                    done.set()
        return record

    for text, at in zip(texts, times):
        time.sleep(max(0.0, start + at - time.perf_counter()))
        now = time.perf_counter()
        submit(text).add_done_callback(answered(now))
    done.wait(600)
    elapsed = time.perf_counter() - start
    ms = sorted(x * 1000 for x in latencies)
    return {"sentences": len(ms), "sentences_per_s": round(len(ms) / elapsed, 2),
            "p50_ms": round(statistics.median(ms), 1) if ms else None,
            "p99_ms": round(ms[min(len(ms) - 1, int(0.99 * len(ms)))], 1) if ms else None}


def engines(translator: Translator, args: argparse.Namespace) -> dict:
    """Each engine's (submit(text) -> future, close)."""
    decode = translator.settings(beam=args.beam, max_len_b=args.max_len_b, nbest=1)
    out = {}
    continuous = ContinuousTranslator(translator)
    out["continuous"] = (lambda text: continuous.submit(text, decode).future, continuous.close)
    batcher = DynamicBatcher(lambda key, items: translator.translate(items, decode), max_cost=decode.batch_tokens,
                             wait_ms=args.wait_ms)
    out["request"] = (lambda text: batcher.submit("t", [text], len(text.split()) + 1), batcher.close)
    if args.ct2:
        try:
            import ctranslate2
        except ImportError:
            print("ctranslate2 is not installed: its engine is skipped", file=sys.stderr)
        else:
            ct2 = ctranslate2.Translator(args.ct2, device="cpu", inter_threads=1, intra_threads=args.threads)
            tok = translator.tokenizer

            def run(key, items):
                pieces = [tok.pieces(tok.encode(t, "src"), side="src") + ["</s>"] for t in items]
                res = ct2.translate_batch(pieces, beam_size=args.beam, max_decoding_length=args.max_len_b)
                return [" ".join(r.hypotheses[0]) for r in res]
            ct2_batcher = DynamicBatcher(run, max_cost=decode.batch_tokens, wait_ms=args.wait_ms)
            out["ctranslate2"] = (lambda text: ct2_batcher.submit("t", [text], len(text.split()) + 1),
                                  ct2_batcher.close)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="model directory (default: a random-weight toy-shaped one)")
    ap.add_argument("--rates", default="2,8,32", help="arrival rates, sentences per second (comma-separated)")
    ap.add_argument("--seconds", type=float, default=20.0, help="seconds of arrivals per engine and rate")
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--max-len-b", type=int, default=50)
    ap.add_argument("--wait-ms", type=float, default=5.0, help="the request batcher's gathering window")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--ct2", default=None, help="a CTranslate2 model directory of the same model (optional)")
    ap.add_argument("--dry", action="store_true", help="two rates, 2 s each, 8 output tokens: a check that it runs")
    args = ap.parse_args()
    if args.dry:
        args.rates, args.seconds, args.max_len_b = "5,20", 2.0, min(args.max_len_b, 8)
    torch.set_num_threads(args.threads)
    texts = [s for s, _ in generate_pairs(4000, SEED)]
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(args.model) if args.model else random_model(Path(tmp), texts[:500])
        translator = Translator.load(model_dir, Runtime(device="cpu"))
        results: dict = {}
        for name, (submit, close) in engines(translator, args).items():
            submit(texts[0]).result(60)  # warm up
            results[name] = {}
            for rate in (float(r) for r in args.rates.split(",")):
                times = arrivals(rate, args.seconds, SEED)
                results[name][f"{rate:g}/s"] = drive(submit, texts[:len(times)], times)
            close()
    print(json.dumps({"benchmark": "serving_continuous", "date": datetime.date.today().isoformat(),
                      "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                      "threads": args.threads, "model": args.model or "random (toy shape)", "beam": args.beam,
                      "max_len_b": args.max_len_b, "seconds": args.seconds, "results": results}, indent=1))


def random_model(out: Path, sentences: list[str]) -> Path:
    """A random-weight model of the test toy's shape (``bench/export_speed.py``'s)."""
    sys.path.insert(0, str(Path(__file__).parent))
    from export_speed import random_model_dir

    return random_model_dir(out / "random", sentences, shape="toy")


if __name__ == "__main__":
    main()
