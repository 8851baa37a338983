"""Domain adaptation with and without ``--extend-vocab``, side by side in one process.

A small GPT (``src/transduce/demo_lm.yaml``) is trained on the toy corpus's German side (or
``--base MODEL_DIR`` is used), then fine-tuned for ``--steps`` steps on Multi30k's German training
text twice, the same recipe, seed and data: ``plain`` (``--init-from``: the toy tokenizer) and
``extended`` (``--init-from --extend-vocab N``). Both, and the base model, are scored with
``transduce.evaluation.perplexity`` on Multi30k's German validation text. Per-token perplexity
is not comparable between tokenizers, so the headline is ``nll_total`` (nats for the whole
text) and nats per word; also pieces per word of each tokenizer, the share of <unk>, and the
fine-tuning's seconds per step in the training loop (extended over plain: a ratio of one run
each, in the same process, one after the other; a shared machine makes it rough).

Prints one JSON object.

Usage:
    python bench/extend_vocab.py                          # base 400 steps, fine-tunes 300, N = 1000
    python bench/extend_vocab.py --base runs/demo_lm/model --steps 300 --new 1000
    python bench/extend_vocab.py --dry                    # a smoke run: 20 + 10 steps
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import torch

from transduce.config import load_run_config
from transduce.data.corpus import read_lines
from transduce.data.tokenizer import UNK_ID, Tokenizer
from transduce.evaluation import perplexity
from transduce.model.io import saved_model_settings
from transduce.training.loop import run_training

DEMO_LM = Path(__file__).resolve().parents[1] / "src" / "transduce" / "demo_lm.yaml"


def _multi30k() -> Path:
    root = Path(os.environ.get("TRANSDUCE_MULTI30K") or Path(__file__).resolve().parents[1] / "../shared/data/multi30k")
    if not (root / "train.de.gz").is_file():
        sys.exit(f"Multi30k not found at {root} (set TRANSDUCE_MULTI30K)")
    return root.resolve()


def _tokenizer_stats(tok: Tokenizer, lines: list[str]) -> dict[str, float]:
    rows = tok.encode_batch(lines, "tgt")
    pieces, words = sum(map(len, rows)), sum(len(line.split()) for line in lines)
    return {"vocab": tok.tgt_vocab_size, "pieces_per_word": pieces / words,
            "unk_share": sum(r.count(UNK_ID) for r in rows) / pieces}


def _scores(model_dir: Path, valid: Path, words: int) -> dict[str, float]:
    p = perplexity(model_dir, valid)
    return {"perplexity": p["perplexity"], "tokens": p["tokens"], "nll_total": p["nll_total"],
            "nats_per_word": p["nll_total"] / words}


def _fine_tune(work: Path, name: str, base: Path, m30k: Path, steps: int, extend: int | None) -> float:
    overrides = [f"train.init_from={base}", "data.corpus=files", f"data.train_tgt={m30k / 'train.de.gz'}",
                 f"data.valid_tgt={m30k / 'val.de.gz'}", f"train.max_steps={steps}", f"train.eval_every={steps}",
                 f"train.save_every={steps}", "train.warmup_steps=0", "train.threads=2"]
    if extend is not None:
        overrides.append(f"train.extend_vocab={extend}")
    run_training(load_run_config(str(DEMO_LM), overrides, saved_model_settings), work / name)
    records = [json.loads(line) for line in (work / name / "metrics.jsonl").read_text().splitlines()]
    return records[-1]["elapsed"] / steps  # the training loop's time, without preparing the data


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default=None, help="an LM model directory to start from (default: train the demo LM)")
    ap.add_argument("--base-steps", type=int, default=400)
    ap.add_argument("--steps", type=int, default=300, help="fine-tuning steps of each variant")
    ap.add_argument("--new", type=int, default=1000, help="--extend-vocab N")
    ap.add_argument("--dry", action="store_true")
    args = ap.parse_args()
    if args.dry:
        args.base_steps, args.steps = 20, 10
    torch.set_num_threads(2)
    m30k = _multi30k()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        base = Path(args.base) if args.base else None
        if base is None:
            run_training(load_run_config(str(DEMO_LM), [f"train.max_steps={args.base_steps}", "train.threads=2"]),
                         work / "base")
            base = work / "base" / "model"
        plain_s = _fine_tune(work, "plain", base, m30k, args.steps, None)
        extended_s = _fine_tune(work, "extended", base, m30k, args.steps, args.new)
        valid = work / "val.de"
        lines = [line for line in read_lines(m30k / "val.de.gz") if line.strip()]
        valid.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
        words = sum(len(line.split()) for line in lines)
        out = {
            "command": " ".join(sys.argv), "base": str(args.base or f"demo_lm.yaml, {args.base_steps} steps"),
            "fine_tune_steps": args.steps, "extend_vocab": args.new, "valid_sentences": len(lines),
            "valid_words": words,
            "tokenizer": {"old": _tokenizer_stats(Tokenizer.load(base), lines),
                          "extended": _tokenizer_stats(Tokenizer.load(work / "extended" / "model"), lines)},
            "scores": {"base": _scores(base, valid, words), "plain": _scores(work / "plain" / "model", valid, words),
                       "extended": _scores(work / "extended" / "model", valid, words)},
            "seconds_per_step": {"plain": plain_s, "extended": extended_s, "ratio": extended_s / plain_s},
        }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
