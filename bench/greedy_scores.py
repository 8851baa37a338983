"""What leaving greedy search unscored is worth: one Translator translates the same sentences
scored (``translate_detailed``: each step's log-softmax over the vocabulary, scores summed) and
unscored (``translate``: the largest logit, scores 0, as CTranslate2's default
``return_scores=False``), eagerly and with ``--compile``, the settings alternated round by round
in one process, 1 thread, timed by CPU time after a warm-up run of each (which compiles).

Prints one JSON object: the median and fastest CPU seconds of each setting, the ratios scored /
unscored (median of the rounds' ratios, and of the fastest rounds), and whether the texts are
the same (they must be, but for two logits that round to one log-prob).

Usage:
    python bench/greedy_scores.py [--model RUN/model --src test_2016_flickr.en | --shape demo] [--rounds 7]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import export_speed as X
from transduce.inference import Runtime, Translator


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    X.model_arguments(ap)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    torch.set_num_threads(1)
    texts = X.source_texts(args)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(args.model) if args.model else X.random_model_dir(Path(tmp) / "random", texts, args.shape)
        kwargs = {} if args.model else {"max_len_a": 0.0, "max_len_b": args.out_len, "min_len": args.out_len}
        report = {"benchmark": "greedy_scores", "model": args.model or f"random ({args.shape} shape)",
                  "sentences": len(texts), "rounds": args.rounds, "threads": 1, "torch": torch.__version__}
        for label, compiled in (("eager", False), ("compiled", True)):
            translator = Translator.load(model_dir, Runtime(device="cpu", compile=compiled))
            kwargs["batch_tokens"] = int(64 * np.mean([len(translator.tokenizer.encode(t, "src")) + 1 for t in texts]))
            runs = {"scored": lambda: [t.best.text for t in translator.translate_detailed(texts, beam=1, **kwargs)],
                    "unscored": lambda: translator.translate(texts, beam=1, **kwargs)}
            outputs = {name: run() for name, run in runs.items()}  # (the warm-up: compiles)
            cpu = {name: [] for name in runs}
            for r in range(args.rounds):
                for name in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
                    start = time.process_time()
                    runs[name]()
                    cpu[name].append(time.process_time() - start)
            for name in runs:
                report[f"{label}_cpu_s_{name}_median"] = round(statistics.median(cpu[name]), 3)
                report[f"{label}_cpu_s_{name}_best"] = round(min(cpu[name]), 3)
            report[f"{label}_speedup_median"] = round(statistics.median(
                [a / b for a, b in zip(cpu["scored"], cpu["unscored"])]), 3)
            report[f"{label}_speedup_best"] = round(min(cpu["scored"]) / min(cpu["unscored"]), 3)
            report[f"{label}_same_output"] = sum(a == b for a, b in zip(outputs["scored"], outputs["unscored"]))
    report["loadavg"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
