"""A ``transduce ablate`` run's rows scored at one training step: the paper's equal-steps view
beside the equal-minutes one that a time budget gives.

Each row's checkpoint ``OUT/rows/ID/checkpoints/step_<STEP>`` (those the run kept: a row that
stopped before STEP, or whose checkpoint was pruned by ``train.keep_last``, is ``null``) is
scored with the trainer's own validation: perplexity per target token and greedy BLEU on the
validation split. Prints JSON, row by row.

Usage:
    python bench/ablate_at_step.py OUT --step 400 [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

from transduce.config import load_run_config
from transduce.model import load_model
from transduce.training.loop import run_data
from transduce.training.validation import validation_bleu, validation_loss


def score(row: Path, step: int) -> dict[str, float] | None:
    ckpt = row / "checkpoints" / f"step_{step:08d}"
    if not ckpt.is_dir():
        return None
    cfg = load_run_config(str(row / "config.yaml"), [])
    data = run_data(cfg, row)  # the ablation's prepared data, named by the row's config
    model = load_model(ckpt)
    n, cpu = cfg.data.valid_max_sentences, torch.device("cpu")
    _, nll = validation_loss(model, data.split("valid").head(n), cfg, cpu)
    return {"val_ppl": math.exp(min(nll, 50.0)), **validation_bleu(model, data.tokenizer, data.texts("valid")[:n],
                                                                   cfg, cpu)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="the ablation's --out")
    ap.add_argument("--step", type=int, required=True)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = json.loads((args.out / "table3.json").read_text())  # the run's row order, base first
    print(json.dumps({"step": args.step, "rows": {r["row"]: score(args.out / "rows" / r["row"], args.step)
                                                  for r in rows}}, indent=1))


if __name__ == "__main__":
    main()
