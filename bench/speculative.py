"""Speculative decoding: a model's greedy search alone, its draft alone, and the two together.

A model directory (the teacher) and a draft directory (e.g. a shallow-decoder student distilled
from it, docs/guides/speculative-decoding.md): each system translates ``--src`` greedily; reported are
BLEU against ``--ref``, the share of outputs identical to the teacher's, output tokens per
second and, for speculative decoding with K = ``--draft-tokens`` proposals per step, the share
of proposals accepted and the output tokens per step of the teacher.

Speculative decoding is a latency technique: a batch advances by its rows' smallest acceptance
(``inference/speculative.py``), so the systems are timed one sentence at a time
(``--batch-tokens 1``) unless told otherwise. Outputs, BLEU and the identity check come from one
pass over all of ``--src`` in batches of ``--pass-batch-tokens`` (greedy output does not depend
on the batching); the speeds and acceptance rates from ``--runs`` rounds over its first
``--timing-lines`` lines, the systems interleaved in each round (a shared machine drifts), as the
median per system, and its speed relative to the teacher's as the median of the rounds' ratios.

Usage:
    python bench/speculative.py TEACHER_DIR --draft DRAFT_DIR --src test.en --ref test.de \\
        [--draft-tokens 2 3 4 5 6 8] [--draft-threshold 0 0.5] [--threads 1] [--runs 3] [--timing-lines 200]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
from dataclasses import replace
import time

import torch

from transduce.config import DecodeConfig
from transduce.data.corpus import read_lines
from transduce.inference import Translator
from transduce.inference.search import DraftStats
from transduce.progress import progress_bar


def output_tokens(translations) -> int:
    """Tokens the search produced: each hypothesis' tokens, plus its EOS when it ended."""
    return sum(len(t.best.tokens) + int(t.best.ended) for t in translations)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model_dir", help="the teacher")
    p.add_argument("--draft", required=True, help="the draft model directory (same tokenizer)")
    p.add_argument("--src", required=True)
    p.add_argument("--ref", required=True)
    p.add_argument("--draft-tokens", type=int, nargs="+", default=[2, 3, 4, 5, 6, 8])
    p.add_argument("--draft-threshold", type=float, nargs="+", default=[0.0],
                   help="the draft stops proposing below this probability (0: never); each with each K")
    p.add_argument("--batch-tokens", type=int, default=1, help="source tokens per batch (default 1: one sentence)")
    p.add_argument("--pass-batch-tokens", type=int, default=4096, help="batch budget of the full pass")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--timing-lines", type=int, default=200)
    return p.parse_args(argv)


def timed_runs(systems: dict, settings: dict, sample: list[str], runs: int) -> dict[str, list[float]]:
    """Seconds of each system on ``sample``, ``runs`` rounds with every system once a round."""
    times: dict[str, list[float]] = {name: [] for name in systems}
    with progress_bar(runs * len(systems), unit="runs", desc="timing") as bar:  # stderr: JSON to stdout
        for _ in range(runs):
            for name, tr in systems.items():
                start = time.perf_counter()
                tr.translate_detailed(sample, settings[name])
                times[name].append(time.perf_counter() - start)
                bar.update()
    return times


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    texts, refs = list(read_lines(args.src)), list(read_lines(args.ref))
    decode = DecodeConfig(beam=1, batch_tokens=args.batch_tokens)
    systems = {"teacher": Translator.load(args.model_dir), "draft": Translator.load(args.draft)}
    settings = {"teacher": decode, "draft": decode}
    for k in args.draft_tokens:
        for threshold in args.draft_threshold:
            name = f"speculative K={k}" + (f" P={threshold:g}" if threshold else "")
            systems[name] = Translator.load(args.model_dir, draft=args.draft)
            settings[name] = replace(decode, draft_tokens=k, draft_threshold=threshold)
    load_before = os.getloadavg()[0]
    outputs, results = {}, {}
    for name, tr in systems.items():  # one full pass each: outputs, BLEU, identity
        outputs[name] = tr.translate_detailed(texts, settings[name], batch_tokens=args.pass_batch_tokens)
        if tr.speculation is not None:
            tr.speculation.stats = DraftStats()  # count the timed runs only
        results[name] = {}
    sample = texts[:args.timing_lines]
    tokens = {name: output_tokens(outputs[name][:args.timing_lines]) for name in systems}
    times = timed_runs(systems, settings, sample, args.runs)
    import sacrebleu

    teacher = [t.best.tokens for t in outputs["teacher"]]
    for name, tr in systems.items():
        if tr.speculation is not None:
            st = tr.speculation.stats
            results[name] = {"acceptance": round(st.acceptance, 4),
                             "tokens_per_teacher_step": round(st.tokens_per_round, 3)}
        median = statistics.median(times[name])
        hyps = [t.best.text for t in outputs[name]]
        results[name].update({
            "bleu": round(sacrebleu.corpus_bleu(hyps, [refs]).score, 2),
            "identical_to_teacher": round(sum(t.best.tokens == e for t, e in zip(outputs[name], teacher))
                                          / len(texts), 4),
            "tokens_per_s": round(tokens[name] / median, 1),
            "runs_s": [round(x, 3) for x in times[name]],
        })
    for name in systems:
        # each round's ratio (the systems ran back to back in it), then their median: a machine
        # whose speed drifts between rounds moves both sides of a round together
        ratios = [(tokens[name] / mine) / (tokens["teacher"] / theirs)
                  for mine, theirs in zip(times[name], times["teacher"])]
        results[name]["vs_teacher"] = round(statistics.median(ratios), 2)
        results[name]["vs_teacher_rounds"] = [round(r, 2) for r in ratios]
    print(json.dumps({
        "date": datetime.date.today().isoformat(), "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(), "threads": args.threads, "torch": torch.__version__, "python": sys.version.split()[0],
        "teacher": os.path.abspath(args.model_dir), "draft": os.path.abspath(args.draft), "src": args.src,
        "sentences": len(texts), "timing_lines": len(sample), "batch_tokens": args.batch_tokens,
        "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)], "results": results,
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
