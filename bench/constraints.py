"""Lexically constrained decoding and MBR against plain beam search, on any translation model directory.

One command for a model directory, a test set and its references (plain or gzip, e.g. Multi30k's
``test_2016_flickr.en.gz``/``.de.gz``). Four systems translate the same sentences in the same
process, timed in ``--runs`` interleaved rounds (median; a shared machine drifts):

- ``plain``: beam ``--beam``;
- ``constrained``: the same beam with each sentence's constraints (below);
- ``mbr_nbest``: MBR with chrF as the utility over beam ``--mbr-nbest``'s n-best (0: skip);
- ``mbr_samples``: MBR with chrF over ``--mbr-samples`` samples (seeds 0..N-1; 0: skip).

The constraints come from the references (as in Post & Vilar, 2018; Hu et al., 2019), by a
seeded rule that favours rare words the model misses: plain beam search translates the sentences
once (the warm-up); a reference's candidate words are those (runs of ``\\w``) of at least
``--min-chars`` characters, not digits, that occur once in it and are not among the ``--common``
most frequent words of all the references (articles and the like); each sentence gets ``n`` of
them, ``n`` drawn from 1..``--max-constraints``, first among those that are not words of the
plain output, then (where fewer are missed) among the others, sampled with
``random.Random(--seed)``. A word given once should appear once, and the search refuses to
complete a met constraint again, so a word the reference repeats is no candidate. A constraint
counts as met when its words appear in the output in sequence (whole words, as text), and as
repeated when they appear more than once. Reported per system: BLEU and chrF (sacrebleu,
against the references), the share of constraints met and repeated, sentences per second; then
the constrained/plain and MBR/plain differences. One JSON object on stdout (and in ``--out``).

``--limit N`` takes the first N sentences (a quick run); ``--dry`` is 8 sentences, one round.

Usage:
    python bench/constraints.py MODEL_DIR --src test.en[.gz] --ref test.de[.gz] [--limit N] [--beam 4] \\
        [--max-constraints 2] [--mbr-nbest 8] [--mbr-samples 8] [--runs 3] [--threads 2] [--device cpu] \\
        [--out result.json]
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
from collections import Counter

import sacrebleu
import torch

from transduce.atomic import atomic_write_text
from transduce.data.corpus import read_lines
from transduce.inference import Runtime, load

_WORD = re.compile(r"\w+")


def _words(text: str) -> list[str]:
    return _WORD.findall(text)


def occurrences(text: str, phrase: str) -> int:
    """How many times the words of ``phrase`` appear in ``text``'s, in sequence."""
    words, want = _words(text), _words(phrase)
    n = len(want)
    return sum(words[i:i + n] == want for i in range(len(words) - n + 1)) if n else 0


def reference_constraints(refs: list[str], plain: list[str], most: int, min_chars: int, common: int,
                          seed: int) -> list[list[str]]:
    """1 to ``most`` words of each reference, rare ones missing from the ``plain`` output
    first, drawn with a fixed seed (the rule is the module doc's)."""
    rng = random.Random(seed)
    frequent = {w for w, _ in Counter(w for ref in refs for w in _words(ref)).most_common(common)}
    out = []
    for ref, hyp in zip(refs, plain):
        once = Counter(_words(ref))
        words = sorted(w for w, n in once.items() if n == 1 and len(w) >= min_chars and not w.isdigit()
                       and w not in frequent)
        have = set(_words(hyp))
        missed, found = [w for w in words if w not in have], [w for w in words if w in have]
        n = min(len(words), rng.randint(1, most))
        picked = rng.sample(missed, min(n, len(missed)))
        out.append(picked + rng.sample(found, n - len(picked)))
    return out


def coverage(outputs: list[str], constraints: list[list[str]]) -> tuple[float, float]:
    """The shares of constraints that appear in their sentence's output, and more than once."""
    counts = [occurrences(out, phrase) for out, c in zip(outputs, constraints) for phrase in c]
    if not counts:
        return 1.0, 0.0
    return sum(n > 0 for n in counts) / len(counts), sum(n > 1 for n in counts) / len(counts)


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


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model_dir")
    p.add_argument("--src", required=True, help="source sentences, one a line (plain or gzip)")
    p.add_argument("--ref", required=True, help="their reference translations (plain or gzip)")
    p.add_argument("--limit", "--lines", type=int, default=None, help="the first N sentences (default: all)")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--max-constraints", type=int, default=2)
    p.add_argument("--min-chars", type=int, default=3)
    p.add_argument("--common", type=int, default=20, help="the most frequent reference words, never constraints")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0, help="the constraint draw's seed")
    p.add_argument("--mbr-nbest", type=int, default=8, help="n-best size of the MBR system (0: skip it)")
    p.add_argument("--mbr-samples", type=int, default=8, help="samples of the sampled-MBR system (0: skip it)")
    p.add_argument("--out", default=None, help="also write the JSON here")
    p.add_argument("--dry", action="store_true", help="8 sentences, one round")
    return p.parse_args(argv)


def systems(translator, sources: list[str], constraints: list[list[str]], args: argparse.Namespace) -> dict:
    """Each system's name -> a call that translates ``sources`` (the module doc)."""
    out = {
        "plain": lambda: translator.translate(sources, beam=args.beam, nbest=1),
        "constrained": lambda: translator.translate(sources, beam=args.beam, nbest=1, constraints=constraints),
    }
    if args.mbr_nbest:
        n = args.mbr_nbest
        out["mbr_nbest"] = lambda: translator.translate(sources, beam=n, nbest=n, rerank="mbr", mbr_utility="chrf")
    if args.mbr_samples:
        out["mbr_samples"] = lambda: translator.translate(sources, rerank="mbr", mbr_utility="chrf",
                                                          mbr_samples=args.mbr_samples)
    return out


def scored(outputs: list[str], refs: list[str], constraints: list[list[str]], seconds: list[float]) -> dict:
    met, repeated = coverage(outputs, constraints)
    return {"bleu": round(sacrebleu.corpus_bleu(outputs, [refs]).score, 2),
            "chrf": round(sacrebleu.corpus_chrf(outputs, [refs]).score, 2),
            "constraints_met": round(met, 4), "constraints_repeated": round(repeated, 4),
            "sentences_per_s": round(len(outputs) / statistics.median(seconds), 2)}


def versus(system: dict, plain: dict) -> dict:
    return {"speed_ratio": round(system["sentences_per_s"] / plain["sentences_per_s"], 3),
            "bleu_gain": round(system["bleu"] - plain["bleu"], 2),
            "chrf_gain": round(system["chrf"] - plain["chrf"], 2)}


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    limit, runs = (8, 1) if args.dry else (args.limit, args.runs)
    sources = list(read_lines(args.src))[:limit]
    refs = list(read_lines(args.ref))[: len(sources)]
    translator = load(args.model_dir, Runtime(device=args.device, threads=args.threads))
    plain = translator.translate(sources, beam=args.beam, nbest=1)  # the warm-up, and what the rule reads
    constraints = reference_constraints(refs, plain, args.max_constraints, args.min_chars, args.common, args.seed)
    calls = systems(translator, sources, constraints, args)
    seconds: dict[str, list[float]] = {name: [] for name in calls}
    outputs: dict[str, list[str]] = {}
    for _ in range(runs):  # interleaved: a shared machine drifts
        for name, fn in calls.items():
            took, outputs[name] = timed(fn)
            seconds[name].append(took)
    report = {name: scored(outputs[name], refs, constraints, seconds[name]) for name in calls}
    result = {
        "benchmark": "constraints", "model_dir": os.fspath(args.model_dir), "src": os.fspath(args.src),
        "sentences": len(sources), "constraints": sum(len(c) for c in constraints),
        "constraints_missed_by_plain": round(1 - coverage(plain, constraints)[0], 4), "beam": args.beam,
        "max_constraints": args.max_constraints, "min_chars": args.min_chars, "common": args.common,
        "seed": args.seed, "mbr_nbest_size": args.mbr_nbest, "mbr_sample_count": args.mbr_samples, "runs": runs,
        "systems": report,
        "vs_plain": {name: versus(report[name], report["plain"]) for name in calls if name != "plain"},
        "date": datetime.date.today().isoformat(), "commit": commit(), "device": args.device,
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(), "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(), "load": [round(x, 2) for x in os.getloadavg()],
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        atomic_write_text(args.out, text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
