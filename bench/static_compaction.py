"""What the compiled greedy search's compaction is worth: one Translator with ``--compile``
translates the same sentences with ``COMPACT_BELOW`` at 0 (the static batch runs until its last
sentence ends) and at its shipped value (the live sentences go on in a smaller search when at a
check at most that share is live), the two settings alternated round by round in one process,
1 thread, timed by CPU time after a warm-up run of each (which compiles for the shapes it meets).

Prints one JSON object: the row-steps (rows of the search times its steps, summed over the
batches) and the median and fastest CPU seconds of each setting, their ratio, and whether the
outputs are the same (they must be: compaction moves rows, it computes nothing differently).

Usage (a trained model: on the random one of ``--shape``, every sentence ends at the same step):
    python bench/static_compaction.py --model RUN/model --src test_2016_flickr.en [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from transduce.inference import Runtime, Translator
from transduce.inference.search import static_shapes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="trained model directory")
    ap.add_argument("--src", required=True, help="source sentences, one a line")
    ap.add_argument("--sentences", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    texts = Path(args.src).read_text(encoding="utf-8").splitlines()[:args.sentences]
    translator = Translator.load(args.model, Runtime(device="cpu", compile=True))
    batch_tokens = int(64 * np.mean([len(translator.tokenizer.encode(t, "src")) + 1 for t in texts]))
    shipped = static_shapes.COMPACT_BELOW
    counted = {"row_steps": 0}
    step = static_shapes.StaticSearch.step

    def counting(search, i):
        counted["row_steps"] += search.done.shape[0]
        return step(search, i)
    static_shapes.StaticSearch.step = counting

    def run(below: float) -> tuple[list[str], int, float]:
        static_shapes.COMPACT_BELOW = below
        counted["row_steps"] = 0
        start = time.process_time()
        out = translator.translate(texts, beam=1, batch_tokens=batch_tokens)
        return out, counted["row_steps"], time.process_time() - start

    settings = {"without": 0.0, "with": shipped}
    outputs, row_steps, cpu = {}, {}, {name: [] for name in settings}
    for name, below in settings.items():  # (the warm-up: compiles)
        outputs[name], row_steps[name], _ = run(below)
    for r in range(args.rounds):
        for name in (settings if r % 2 == 0 else list(settings)[::-1]):
            cpu[name].append(run(settings[name])[2])
    static_shapes.COMPACT_BELOW, static_shapes.StaticSearch.step = shipped, step
    report = {"benchmark": "static_compaction", "model": args.model, "sentences": len(texts),
              "batch_tokens": batch_tokens, "compact_below": shipped, "rounds": args.rounds, "threads": 1,
              "torch": torch.__version__, "same_output": outputs["with"] == outputs["without"]}
    for name in settings:
        report[f"row_steps_{name}"] = row_steps[name]
        report[f"cpu_s_{name}_median"] = round(statistics.median(cpu[name]), 3)
        report[f"cpu_s_{name}_best"] = round(min(cpu[name]), 3)
    report["speedup_median"] = round(report["cpu_s_without_median"] / report["cpu_s_with_median"], 3)
    report["speedup_best"] = round(report["cpu_s_without_best"] / report["cpu_s_with_best"], 3)
    report["loadavg"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
