"""The vocabulary shortlist on and off, side by side in one process: sentences/s and BLEU.

Builds the shortlist into a copy of MODEL_DIR from the training text (``--train-src``,
``--train-tgt``, the model's tokenizer; the same code as ``transduce shortlist``), then
translates ``--src`` with the full vocabulary (the peer) and with the shortlist, greedy and beam,
interleaved, the median of ``--runs`` timed passes after a warm-up. Prints JSON: per search the
sentences/s of each, their ratio, each BLEU against ``--ref`` and the share of identical outputs.

Usage:
    python bench/shortlist.py MODEL_DIR --train-src train.en --train-tgt train.de --src test.en --ref test.de \
        [--k 20] [--frequent 100] [--beams 1 4] [--threads 1] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import sacrebleu
import torch

from transduce.data.corpus import read_lines
from transduce.inference import Runtime, Translator
from transduce.inference.search.shortlist import shortlist_corpus


def compare(translator: Translator, texts: list[str], refs: list[str] | None, beam: int, runs: int) -> dict:
    search = {"beam": beam, "nbest": 1}
    outputs, seconds = {}, {"full": [], "shortlist": []}
    for name, on in (("full", False), ("shortlist", True)):  # warm-up, and the outputs
        outputs[name] = translator.translate(texts, shortlist=on, **search)
    for _ in range(runs):
        for name, on in (("full", False), ("shortlist", True)):
            t0 = time.perf_counter()
            translator.translate(texts, shortlist=on, **search)
            seconds[name].append(time.perf_counter() - t0)
    rate = {name: len(texts) / statistics.median(s) for name, s in seconds.items()}
    row = {"beam": beam, "sentences_per_s": rate, "ratio": rate["shortlist"] / rate["full"],
           "identical": sum(a == b for a, b in zip(outputs["full"], outputs["shortlist"])) / len(texts)}
    if refs is not None:
        row["bleu"] = {name: sacrebleu.corpus_bleu(out, [refs]).score for name, out in outputs.items()}
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model_dir")
    p.add_argument("--train-src", required=True)
    p.add_argument("--train-tgt", required=True)
    p.add_argument("--src", required=True)
    p.add_argument("--ref", default=None)
    p.add_argument("--k", type=int, default=20)
    p.add_argument("--frequent", type=int, default=100)
    p.add_argument("--beams", type=int, nargs="+", default=[1, 4])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    texts = list(read_lines(args.src))
    refs = list(read_lines(args.ref)) if args.ref else None
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "model"
        shutil.copytree(args.model_dir, model_dir)
        t0 = time.perf_counter()
        shortlist = shortlist_corpus(str(model_dir), args.train_src, args.train_tgt, args.k, args.frequent)
        built_s = time.perf_counter() - t0
        with Translator.load(str(model_dir), Runtime(device="cpu", threads=args.threads)) as translator:
            sources = [torch.tensor(translator.encode_source(t)[0] or [0]) for t in texts]
            union = [len(shortlist.union(s[None], (0, 1, 2))) for s in sources]
            rows = [compare(translator, texts, refs, beam, args.runs) for beam in args.beams]
    print(json.dumps({"model_dir": args.model_dir, "sentences": len(texts), "threads": args.threads,
                      "k": args.k, "frequent": args.frequent, "target_vocab": int(translator.config.tgt_vocab_size),
                      "union_per_sentence_median": statistics.median(union), "build_s": built_s,
                      "torch": torch.__version__, "results": rows}, indent=2))


if __name__ == "__main__":
    main()
