"""Lexically constrained decoding against plain beam search, on any translation model directory.

Each of the first ``--lines`` sentences of ``--src`` gets 1 to ``--max-constraints`` constraints
taken from its reference (``--ref``): distinct words of the reference (of at least
``--min-chars`` letters), drawn with a fixed seed, as in the constrained-decoding papers (Post &
Vilar, 2018; Hu et al., 2019). Both systems translate the same sentences with beam ``--beam``;
reported are BLEU and chrF against the references, the share of constraints that appear in the
output (as text), the speed in sentences per second (median of ``--runs`` interleaved rounds)
and the constrained/plain ratios, as one JSON object. With ``--mbr-nbest N`` (0: skip) a third
system reranks beam ``N``'s N-best by minimum Bayes risk with chrF as the utility
(``decode.rerank=mbr``), unconstrained, for its BLEU and chrF against plain beam search.

``--dry`` runs a few sentences once (CI, so the benchmark never rots).

Usage:
    python bench/constraints.py MODEL_DIR --src test.en --ref test.de [--lines 1000] [--beam 4] \\
        [--max-constraints 2] [--mbr-nbest 8] [--runs 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import time

import sacrebleu
import torch

from transduce.data.corpus import read_lines
from transduce.inference import Runtime, load


def reference_constraints(refs: list[str], most: int, min_chars: int, seed: int) -> list[list[str]]:
    """1 to ``most`` distinct words of each reference (letters only, >= ``min_chars``)."""
    rng = random.Random(seed)
    out = []
    for ref in refs:
        words = sorted({w for w in re.findall(r"\w+", ref) if len(w) >= min_chars and not w.isdigit()})
        out.append(rng.sample(words, min(len(words), rng.randint(1, most))))
    return out


def coverage(outputs: list[str], constraints: list[list[str]]) -> float:
    """The share of constraints that appear in their sentence's output."""
    total = sum(len(c) for c in constraints)
    met = sum(phrase in out for out, c in zip(outputs, constraints) for phrase in c)
    return met / total if total else 1.0


def timed(fn) -> tuple[float, list[str]]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model_dir")
    p.add_argument("--src", required=True)
    p.add_argument("--ref", required=True)
    p.add_argument("--lines", type=int, default=1000)
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--max-constraints", type=int, default=2)
    p.add_argument("--min-chars", type=int, default=3)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mbr-nbest", type=int, default=8, help="n-best size for the MBR system (0: skip it)")
    p.add_argument("--dry", action="store_true", help="8 sentences, one run")
    args = p.parse_args(argv)
    lines, runs = (8, 1) if args.dry else (args.lines, args.runs)
    sources = list(read_lines(args.src))[:lines]
    refs = list(read_lines(args.ref))[: len(sources)]
    constraints = reference_constraints(refs, args.max_constraints, args.min_chars, args.seed)
    translator = load(args.model_dir, Runtime(device="cpu", threads=args.threads))
    systems = {
        "plain": lambda: translator.translate(sources, beam=args.beam, nbest=1),
        "constrained": lambda: translator.translate(sources, beam=args.beam, nbest=1, constraints=constraints),
    }
    if args.mbr_nbest:
        n = args.mbr_nbest
        systems["mbr_chrf"] = lambda: translator.translate(sources, beam=n, nbest=n, rerank="mbr", mbr_utility="chrf")
    seconds: dict[str, list[float]] = {name: [] for name in systems}
    outputs: dict[str, list[str]] = {}
    for _ in range(runs):  # interleaved: a shared machine drifts
        for name, fn in systems.items():
            took, outputs[name] = timed(fn)
            seconds[name].append(took)
    report = {name: {"bleu": round(sacrebleu.corpus_bleu(outputs[name], [refs]).score, 2),
                     "chrf": round(sacrebleu.corpus_chrf(outputs[name], [refs]).score, 2),
                     "constraints_met": round(coverage(outputs[name], constraints), 4),
                     "sentences_per_s": round(len(sources) / statistics.median(seconds[name]), 2)}
              for name in systems}
    print(json.dumps({
        "benchmark": "constraints", "model_dir": os.fspath(args.model_dir), "sentences": len(sources),
        "constraints": sum(len(c) for c in constraints), "beam": args.beam, "runs": runs, **report,
        "speed_ratio": round(report["constrained"]["sentences_per_s"] / report["plain"]["sentences_per_s"], 3),
        "bleu_gain": round(report["constrained"]["bleu"] - report["plain"]["bleu"], 2), "mbr_nbest": args.mbr_nbest,
        "date": datetime.date.today().isoformat(), "commit": commit(),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(), "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
