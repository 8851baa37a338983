"""Translations through Triton equal ``transduce translate``'s, sentence for sentence.

Starts ``transduce serve MODEL --engine triton`` (a real Triton server, pytriton) on free loopback
ports, sends every line of ``--src`` as its own request from ``--clients`` concurrent clients over
HTTP (so Triton's dynamic batcher groups them into batches of its choosing), and compares each
answer with the translation the model's ``Translator`` gives the whole file in this process with
the model's own decoding settings. Prints one JSON object: sentences, identical, the first
differences, errors, wall time. Needs the ``triton`` extra (numpy < 2).

Usage:
    python bench/triton_check.py --model RUN/model --src test_2016_flickr.en [--clients 16]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from serving import start, stop  # noqa: E402 - the bench's own server start (the triton extra)


def read_lines(path: str) -> list[str]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def ask(url: str, sentence: str) -> tuple[str, str]:
    """One request of one sentence: (translation, error)."""
    import numpy as np
    import tritonclient.http as http

    rows = np.array([sentence.encode("utf-8")], dtype=object).reshape(1, 1)
    text = http.InferInput("text", [1, 1], "BYTES")
    text.set_data_from_numpy(rows)
    result = http.InferenceServerClient(url, network_timeout=600.0).infer("translate", [text])
    return result.as_numpy("translation")[0, 0].decode("utf-8"), result.as_numpy("error")[0, 0].decode("utf-8")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--src", required=True, help="source sentences, one per line (.gz read as gzip)")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the server and of this process")
    args = ap.parse_args()
    from transduce.inference import load

    sentences = read_lines(args.src)
    started = time.perf_counter()
    with load(args.model) as translator:
        want = translator.translate(sentences)
    local_s = time.perf_counter() - started
    with tempfile.TemporaryDirectory() as work:
        proc, base = start("triton", Path(args.model), args.threads, Path(work))
        try:
            url = base.removeprefix("http://")
            started = time.perf_counter()
            with ThreadPoolExecutor(args.clients) as pool:
                got = list(pool.map(lambda s: ask(url, s), sentences))
            served_s = time.perf_counter() - started
        finally:
            exit_code = stop(proc)
    differ = [i for i, (w, (g, _)) in enumerate(zip(want, got)) if w != g]
    print(json.dumps({"model": args.model, "src": args.src, "sentences": len(sentences),
                      "identical": len(sentences) - len(differ), "errors": sum(1 for _, e in got if e),
                      "first_differences": [{"line": i + 1, "translate": want[i], "triton": got[i][0]}
                                            for i in differ[:5]],
                      "clients": args.clients, "triton_seconds": round(served_s, 1),
                      "in_process_seconds": round(local_s, 1), "server_exit": exit_code,
                      "load_average_1min": os.getloadavg()[0]}, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
