"""Long inputs, the quality side: full vs local vs Linformer attention at equal training time.

The task (a generated "lookup", Longformer's reason for global tokens in miniature): a text of
``--length`` words over 16 filler letters ``a..p`` holds one marker ``Q`` followed by a value
letter ``A B C D``; the label is that value. By default (``--copies 0``) it is the text's only
value letter, a needle to find. ``--copies c`` makes it harder: every value letter occurs exactly
c times, so counting letters says nothing and only "which value follows ``Q``" (a binding of
two neighbours, then a read-out at the [CLS] position) answers.

Why the three attention kinds should differ, and where:

- A classifier reads position 0 (BOS, BERT's [CLS]). With ``local`` attention of window W (each
  side) and L layers, that state depends only on positions ``<= L * W``: information moves at
  most W positions a layer. Half the examples put the marker *near* (marker and value at
  positions ``<= W``, one window from [CLS]) and half *far* (both past ``L * W``, out of reach).
  So ``local`` can learn the near half and must guess on the far half (25%, four classes),
  while ``full`` can learn both.
- ``local`` with one global token (``model.global_tokens=1``: position 0 sees and is seen by
  every position, as Longformer's [CLS]) can read the far half: the read-out is long, the
  binding of ``--copies`` is local (neighbours).
- ``linformer`` projects keys and values along the sequence to k rows (k << length) by learned
  matrices: every query sees k mixtures of positions, not positions. Finding one marker among
  hundreds is what such a mixture blurs. It has no window, so its near/far split is not a reach
  limit; but its projections are per position, so it may learn some positions before others.
- ``bigbird`` (blocks of W, 3 random blocks): the first block, which holds [CLS], is global, so
  it reads the far half as ``local_global`` does. ``lsh`` (``--lsh-hashes`` rounds into 16
  buckets, chunks of W): [CLS] sees the keys that hash with it, and the value must land there.

Each variant trains through ``run_training`` (``train.task: classify``, ``model.arch:
encoder_only``) for the same ``train.max_minutes``, one thread each, all variants at the same
time in separate processes (so they share the machine's load alike), then classifies the same
held-out test set with its final model. Reported as JSON: test accuracy (all, near, far),
optimizer steps, training examples, tokens and tokens/s (input tokens, BOS and EOS included;
all texts have one length, so there is no padding; over the trainer's own clock).

Usage:
    python bench/long_task.py [--minutes 5] [--length 512] [--window 32] [--layers 2] [--copies 0]
                              [--variants full,local,local_global,linformer,bigbird,lsh] [--out runs/long_task]
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import platform
import random
import sys
import time
from pathlib import Path

FILLERS = tuple("abcdefghijklmnop")
VALUES = ("A", "B", "C", "D")
MARKER = "Q"
VARIANTS = ("full", "local", "local_global", "linformer", "bigbird", "lsh")


def near_positions(window: int) -> range:
    """Word indices of the marker whose marker and value sit within one window of [CLS].

    Word i is model position i + 1 (BOS is position 0), so the value (word i + 1) is at i + 2 <= W.
    """
    return range(0, window - 1)


def far_positions(length: int, window: int, layers: int) -> range:
    """Word indices of the marker whose marker and value lie past L * W, beyond [CLS]'s reach under
    local attention (marker at model position i + 1 > L * W); the value must fit in the text."""
    return range(layers * window, length - 1)


def make_example(rng: random.Random, length: int, marker_at: int, copies: int) -> tuple[str, str]:
    """One text of ``length`` words with the marker at word ``marker_at``, and its label.

    ``copies`` 0: the answer is the text's only value letter; ``copies`` c >= 1: every value
    letter occurs exactly c times (the answer's copy after the marker included).
    """
    answer = rng.choice(VALUES)
    words = [rng.choice(FILLERS) for _ in range(length)]
    words[marker_at], words[marker_at + 1] = MARKER, answer
    free = [i for i in range(length) if i not in (marker_at, marker_at + 1)]
    values = [v for v in VALUES for _ in range(copies)]
    if copies:
        values.remove(answer)  # its last copy is the one after the marker
    for i, v in zip(rng.sample(free, len(values)), values):
        words[i] = v
    return " ".join(words), answer


def make_split(n: int, length: int, window: int, layers: int, seed: int, copies: int = 0
               ) -> list[tuple[str, str, str]]:
    """``n`` (text, label, "near"/"far") examples, alternately near and far."""
    near, far = near_positions(window), far_positions(length, window, layers)
    if len(near) < 1 or len(far) < 1:
        raise SystemExit(f"--length {length} leaves no room for near and far markers with W={window}, "
                         f"L={layers} (need length > L*W + 1 and W >= 2)")
    rng = random.Random(seed)
    out = []
    for j in range(n):
        bucket = "near" if j % 2 == 0 else "far"
        text, label = make_example(rng, length, rng.choice(near if bucket == "near" else far), copies)
        out.append((text, label, bucket))
    return out


def answer_of(text: str) -> str:
    """The label read off the text: the word after the marker (what the model has to learn)."""
    words = text.split()
    return words[words.index(MARKER) + 1]


def bucket_of(text: str, window: int, layers: int) -> str | None:
    """"near", "far" or None (neither), from the marker's place in the text."""
    i = text.split().index(MARKER)
    return "near" if i in near_positions(window) else "far" if i >= layers * window else None


def model_overrides(variant: str, args: argparse.Namespace) -> dict:
    """The model section of one variant: the same encoder, only the attention differs."""
    base = dict(arch="encoder_only", d_model=args.d_model, n_heads=4, n_encoder_layers=args.layers,
                n_decoder_layers=0, d_ff=2 * args.d_model, dropout=0.0, norm="pre", positions="sinusoidal",
                max_positions=args.length + 2, n_classes=len(VALUES))
    attention = {"full": dict(attention=dict(kind="full")),
                 "local": dict(attention=dict(kind="local", window=args.window)),
                 "local_global": dict(attention=dict(kind="local", window=args.window, global_tokens=1)),
                 "linformer": dict(attention=dict(kind="linformer", linformer_k=args.linformer_k)),
                 # blocks of W; the first block (with [CLS]) is global: it sees every block
                 "bigbird": dict(attention=dict(kind="bigbird", block=args.window, random_blocks=3)),
                 "lsh": dict(attention=dict(kind="lsh", block=args.window, lsh_hashes=args.lsh_hashes,
                                            lsh_buckets=16))}[variant]
    return {**base, **attention}


def run_config(variant: str, args: argparse.Namespace, files: dict[str, str]):
    from transduce.config import RunConfig

    return RunConfig.from_dict({
        "model": model_overrides(variant, args),
        "data": {"corpus": "files", **files, "max_len": args.length, "max_tokens": args.max_tokens},
        "train": {"task": "classify", "max_minutes": args.minutes, "max_steps": 10**6, "optimizer": "adamw",
                  "betas": [0.9, 0.999], "eps": 1.0e-8, "weight_decay": 0.01, "schedule": "linear",
                  "lr": args.lr, "warmup_steps": 50, "label_smoothing": 0.0, "clip_norm": 1.0,
                  "log_every": 25, "eval_every": args.eval_every, "save_every": 10**6, "keep_last": 1,
                  "threads": 1, "seed": args.seed, "device": "cpu"},
    })


def write_data(out: Path, args: argparse.Namespace) -> tuple[dict[str, str], list[tuple[str, str, str]]]:
    """The three splits as ``text<TAB>label`` files and a word-level tokenizer; the test split."""
    from transduce.atomic import atomic_write_text
    from transduce.data.tokenizer import Tokenizer

    sizes = {"train": args.train_size, "valid": args.valid_size, "test": args.test_size}
    splits = {name: make_split(n, args.length, args.window, args.layers, args.seed * 10 + k, args.copies)
              for k, (name, n) in enumerate(sizes.items())}
    files = {}
    (out / "data").mkdir(parents=True, exist_ok=True)
    for name, rows in splits.items():
        files[f"{name}_src"] = str(out / "data" / f"{name}.tsv")
        atomic_write_text(files[f"{name}_src"], "".join(f"{t}\t{label}\n" for t, label, _ in rows))
    # Every letter once per line: BPE keeps each "▁x" as one piece (a word-level vocabulary).
    alphabet = " ".join((*FILLERS, *VALUES, MARKER))
    tok = Tokenizer.train([alphabet] * 8, [alphabet] * 8, out / "tokenizer", vocab_size=64)
    files["tokenizer"] = str(out / "tokenizer")
    check_one_piece_per_word(tok)
    return files, splits["test"]


def check_one_piece_per_word(tok) -> None:
    for w in (*FILLERS, *VALUES, MARKER):
        if len(tok.encode(w, "src")) != 1:
            raise SystemExit(f"tokenizer splits {w!r} into {tok.pieces(tok.encode(w, 'src'), 'src')}")


def train_variant(variant: str, args: argparse.Namespace, files: dict[str, str], out: Path,
                  test: list[tuple[str, str, str]]) -> dict:
    """Train one variant (in its own process) and score its final model on the test split."""
    import torch

    from transduce.inference.classify import Classifier
    from transduce.training.loop import run_training

    torch.set_num_threads(1)
    t0 = time.monotonic()
    trainer, metrics = run_training(run_config(variant, args, files), out / variant)
    train_s = trainer.elapsed()
    predicted = Classifier.load(out / variant / "model").classify([t for t, _, _ in test], batch_size=32)
    examples = trainer.state.tokens  # a classification batch has one target (the label) per example
    tokens = examples * (args.length + 2)  # every text is BOS + length words + EOS: no padding
    result = {"variant": variant, "steps": trainer.state.step, "train_s": round(train_s, 1),
              "train_examples": examples, "train_tokens": tokens, "tokens_per_s": round(tokens / train_s, 1),
              "val_acc": metrics.get("val_acc"), "wall_s": round(time.monotonic() - t0, 1)}
    for bucket in ("all", "near", "far"):
        rows = [(p, label) for p, (_, label, b) in zip(predicted, test) if bucket in ("all", b)]
        result[f"acc_{bucket}"] = round(sum(p == label for p, label in rows) / len(rows), 4)
    return result


def _worker(variant: str, args: argparse.Namespace, files: dict[str, str], out: Path,
            test: list[tuple[str, str, str]], queue) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        queue.put(train_variant(variant, args, files, out, test))
    except Exception as e:  # reported in the JSON, not lost in a child's traceback
        queue.put({"variant": variant, "error": f"{type(e).__name__}: {e}"})


def run_concurrently(variants: list[str], args: argparse.Namespace, files: dict[str, str], out: Path,
                     test: list[tuple[str, str, str]]) -> dict[str, dict]:
    """Each variant in its own process, all at the same time: they share the machine's load alike."""
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(v, args, files, out, test, queue)) for v in variants]
    for proc in procs:
        proc.start()
    results = {r["variant"]: r for r in (queue.get() for _ in procs)}
    for proc in procs:
        proc.join()
    return results


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=5.0, help="train.max_minutes of each variant")
    p.add_argument("--length", type=int, default=512, help="words per text (the model reads length + 2)")
    p.add_argument("--window", type=int, default=32, help="local attention's W (each side)")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--linformer-k", type=int, default=64)
    p.add_argument("--lsh-hashes", type=int, default=2, help="lsh: rounds of hashing (16 buckets, chunks of W)")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--max-tokens", type=int, default=4096, help="tokens per batch")
    p.add_argument("--train-size", type=int, default=20000)
    p.add_argument("--valid-size", type=int, default=200)
    p.add_argument("--test-size", type=int, default=1000)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--copies", type=int, default=0,
                   help="0: the answer is the only value letter (a needle); c: every value c times")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--in-process", action="store_true",
                   help="train the variants one after another in this process (tests; not a fair race)")
    p.add_argument("--out", default="runs/long_task", help="run directories (must not hold runs already)")
    args = p.parse_args(argv)
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        p.error(f"--variants: unknown {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
    out = Path(args.out)
    files, test = write_data(out, args)
    t0 = time.monotonic()
    if args.in_process:
        results = {v: train_variant(v, args, files, out, test) for v in variants}
    else:
        results = run_concurrently(variants, args, files, out, test)
    report = {
        "date": datetime.date.today().isoformat(), "python": platform.python_version(),
        "cpu_count": os.cpu_count(), "load_avg_end": os.getloadavg(), "wall_s": round(time.monotonic() - t0, 1),
        "task": {"length": args.length, "window": args.window, "layers": args.layers,
                 "near_marker_words": [near_positions(args.window).start, near_positions(args.window).stop - 1],
                 "far_marker_words": [args.layers * args.window, args.length - 2],
                 "classes": len(VALUES), "chance": 1 / len(VALUES), "train": args.train_size,
                 "test": args.test_size},
        "model": {"d_model": args.d_model, "layers": args.layers, "heads": 4, "linformer_k": args.linformer_k},
        "minutes_each": args.minutes, "threads_each": 1,
        "concurrent": 1 if args.in_process else len(variants),
        "results": [results[v] for v in variants],
    }
    print(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    sys.exit(1 if any("error" in r for r in main()["results"]) else 0)
