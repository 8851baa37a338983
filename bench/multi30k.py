"""Multi30k from raw files to test BLEU, with the curve of validation BLEU against wall time.

Trains ``configs/multi30k_<src>_<tgt>.yaml`` (or evaluates a run that already exists), then
translates test_2016_flickr with the run's final (checkpoint-averaged) model and prints JSON:

- ``bleu_moses_lc``: the published Multi30k metric: the output lowercased, Moses-normalised and
  tokenized, scored with no further tokenisation against the official ``tok/*.lc.norm.tok.*``
  references (needs the ``moses`` extra);
- ``bleu`` / ``chrf``: sacrebleu on the raw, cased references, with their signatures (on the
  tokenized lowercased references for a run with ``--set data.corpus=multi30k_tok``, whose
  output is already such text and goes into ``bleu_moses_lc`` as it is);
- ``train_minutes``: wall time of training (data preparation included);
- ``curve``: (minutes, step, greedy validation BLEU) of each validation during training, so
  "time to BLEU X" can be read off; also written to ``RUN/curve.json`` (and ``curve.png`` with
  matplotlib).

Validation BLEU during training is greedy sacrebleu BLEU on raw, cased ``val`` (the metric
the trainer keeps the best model by); the test figures use the config's beam search.

Usage:
    TRANSDUCE_MULTI30K=../shared/data/multi30k python bench/multi30k.py --pair en-de --out runs/m30_en_de
    python bench/multi30k.py --pair en-de --out runs/m30_en_de --eval-only     # score an existing run
    python bench/multi30k.py --pair en-de --reverse ...                        # de->en
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def curve(run_dir: Path) -> list[dict]:
    """Each validation of a run: elapsed minutes, step and validation BLEU (or loss)."""
    points = []
    with open(run_dir / "metrics.jsonl", encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            if "val_loss" in r:
                points.append({"minutes": round(r["elapsed"] / 60, 2), "step": r["step"],
                               "val_bleu": round(r["val_bleu"], 2) if "val_bleu" in r else None,
                               "val_loss": round(r["val_loss"], 4)})
    return points


def plot(points: list[dict], path: Path, title: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([p["minutes"] for p in points], [p["val_bleu"] for p in points], marker="o")
    ax.set_xlabel("wall time (minutes)")
    ax.set_ylabel("greedy val BLEU (sacrebleu, cased)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def evaluate_run(run_dir: Path, model_dir: Path, threads: int, device: str = "cpu",
                 max_test: int | None = None) -> dict:
    """Test-set scores of ``model_dir`` with the run's own data and decode settings (on
    ``device``; the first ``max_test`` sentences only, when given)."""
    import torch

    from transduce.config import load_run_config
    from transduce.data import multi30k
    from transduce.evaluation.metrics import evaluate
    from transduce.inference import Runtime, Translator
    from transduce.data.prepare import split_texts

    torch.set_num_threads(threads)
    cfg = load_run_config(run_dir / "config.yaml")
    test = split_texts(cfg.data, "test")[:max_test]
    tgt_lang = cfg.data.src_lang if cfg.data.reverse else cfg.data.tgt_lang
    root = Path(cfg.data.root or multi30k.default_root())
    tok_ref = root / "tok" / f"test_2016_flickr.lc.norm.tok.{tgt_lang}"
    tok_refs = tok_ref.read_text(encoding="utf-8").splitlines()[:max_test] if tok_ref.is_file() else None
    precision = cfg.train.precision if device != "cpu" else "fp32"
    translator = Translator.load(model_dir, Runtime(device=str(device), precision=precision))
    out = evaluate(translator, [s for s, _ in test], [t for _, t in test], cfg.decode, tok_refs,
                   tgt_lang if tok_refs else None, hyps_tokenized=cfg.data.corpus == "multi30k_tok")
    return {k: v for k, v in out.items() if k not in ("tokens_per_s",)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="en-de", help="en-de or en-fr (configs/multi30k_<src>_<tgt>.yaml)")
    ap.add_argument("--config", help="another recipe (e.g. configs/multi30k_en_de_gpu.yaml) instead of --pair's")
    ap.add_argument("--device", default="cpu", help="where the test set is translated (cpu, cuda)")
    ap.add_argument("--max-test", type=int, help="score only the first N test sentences (dry runs)")
    ap.add_argument("--reverse", action="store_true", help="train and score the other direction")
    ap.add_argument("--out", required=True, help="run directory")
    ap.add_argument("--eval-only", action="store_true", help="score an existing run; do not train")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="config overrides passed to transduce train")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    run_dir = Path(args.out)
    config = Path(args.config) if args.config else ROOT / "configs" / f"multi30k_{args.pair.replace('-', '_')}.yaml"
    if not config.is_file():
        print(f"error: no config {config}", file=sys.stderr)
        return 2
    wall = None
    if not args.eval_only:
        cmd = [sys.executable, "-m", "transduce", "train", str(config), "--out", str(run_dir)]
        cmd += [a for o in args.overrides for a in ("--set", o)] + (["--reverse"] if args.reverse else [])
        t0 = time.perf_counter()
        # SIGTERM becomes SystemExit, on which subprocess.call kills the training child
        # (Ctrl-C already does): stopping the benchmark stops the training it started.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        rc = subprocess.call(cmd, env=os.environ.copy())
        wall = time.perf_counter() - t0
        if rc:
            return rc
    points = curve(run_dir)
    (run_dir / "curve.json").write_text(json.dumps(points, indent=1) + "\n", encoding="utf-8")
    plot(points, run_dir / "curve.png", f"Multi30k {args.pair}{' reversed' if args.reverse else ''}")
    with open(run_dir / "metrics.jsonl", encoding="utf-8") as f:
        last = [json.loads(line) for line in f][-1]
    result = {
        "pair": args.pair, "reverse": args.reverse, "run": str(run_dir),
        "train_minutes": round(wall / 60, 1) if wall is not None else None,
        "trained_minutes": round(last["elapsed"] / 60, 1), "steps": last["step"],
        "test_2016_flickr": evaluate_run(run_dir, run_dir / "model", args.threads, args.device, args.max_test),
        "curve": points,
    }
    print(json.dumps(result, indent=1, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
