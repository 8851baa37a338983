"""One multilingual model (en->de + en->fr + en->cs, Multi30k) against the single-pair en->de model,
at equal steps: prints JSON.

Both runs train the same model (``--preset``) with the same token budget for the same number of
steps (``--steps``), each from raw Multi30k with its own joint tokenizer of ``--vocab`` pieces; the
multilingual one lists ``data.pairs`` (target-language tags, pairs drawn with
``data.pair_temperature``), the single one is plain ``data.corpus: multi30k`` en-de. Each is
validated once, at the last step, by greedy BLEU on the first ``--valid`` sentences of Multi30k
``val`` per pair (sacrebleu, raw cased text): ``val_bleu/en-de`` of the multilingual model against
``val_bleu`` of the single one is the comparison; the multilingual run's other pairs are listed too.
The multilingual model sees about a third of the en-de sentences the single one sees in as
many steps: at a small step count it is expected to be behind on en-de.

Usage:
    python bench/multilingual.py --root ../shared/data/multi30k --steps 300 --out runs/multilingual
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def train(out: Path, overrides: list[str]) -> dict:
    """Run ``transduce train`` with ``overrides``; its last validation record and wall time."""
    cmd = [sys.executable, "-m", "transduce", "train", "--out", str(out)]
    for o in overrides:
        cmd += ["--set", o]
    t0 = time.monotonic()
    subprocess.run(cmd, check=True, env=os.environ.copy())
    seconds = time.monotonic() - t0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in records if "val_loss" in r][-1]
    return {"seconds": round(seconds, 1), "step": last["step"],
            **{k: round(v, 3) for k, v in last.items() if k.startswith("val_")}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", required=True, help="the Multi30k raw files' directory")
    ap.add_argument("--out", required=True, help="a new directory for the two runs")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--vocab", type=int, default=2000)
    ap.add_argument("--max-tokens", type=int, default=2000)
    ap.add_argument("--temperature", type=float, default=1.0, help="data.pair_temperature of the multilingual run")
    ap.add_argument("--valid", type=int, default=100, help="validation sentences per pair")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    out = Path(args.out)
    common = [f"model.preset={args.preset}", "data.corpus=multi30k", f"data.root={args.root}",
              f"data.vocab_size={args.vocab}", f"data.max_tokens={args.max_tokens}", "data.tokenizer_sentences=20000",
              f"train.max_steps={args.steps}", f"train.eval_every={args.steps}", f"train.save_every={args.steps}",
              f"train.warmup_steps={max(1, args.steps // 4)}", f"train.seed={args.seed}",
              f"train.threads={args.threads}"]
    multi = train(out / "multi", common + ["data.pairs=[en-de, en-fr, en-cs]",
                                           f"data.pair_temperature={args.temperature}",
                                           f"data.valid_max_sentences={3 * args.valid}"])
    single = train(out / "single", common + ["data.src_lang=en", "data.tgt_lang=de",
                                             f"data.valid_max_sentences={args.valid}"])
    result = {"steps": args.steps, "preset": args.preset, "vocab": args.vocab, "max_tokens": args.max_tokens,
              "temperature": args.temperature, "valid_per_pair": args.valid, "seed": args.seed,
              "en_de_bleu": {"multilingual": multi.get("val_bleu/en-de"), "single": single.get("val_bleu")},
              "multilingual": multi, "single": single, "loadavg": [round(x, 2) for x in os.getloadavg()]}
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
