"""Alignment error rate of cross-attention alignments, without and with guided alignment training.

Data: the embedded toy pair (:mod:`transduce.data.toy`). Its reference alignments are exact and
hand-checkable: the toy lexicon gives each noun, verb and adverb its German forms (``dog`` ->
``Hund``/``Hunde``/``Hunden``, ``thanked`` -> ``gedankt``, ``today`` -> ``heute``), and a source
word is linked to the target word of the same lemma when that lemma occurs once on each side
(:func:`lexicon_links`). German moves verbs to the end ("has thanked the cats" -> "hat den
Katzen gedankt"), so the links are not monotone. Function words are not annotated, so AER is
computed over the annotated source words (predicted links from other source words are left out).

Two identical tiny Transformers (same seed, data order and steps) are trained by the trainer
``transduce train`` runs (:func:`transduce.training.loop.run_training`): one on the label-smoothed
loss alone, one given the training pairs' alignments as a user gives them (a Pharaoh ``i-j`` file,
``data.train_alignments``), so with the guided alignment loss on head 0 of the penultimate decoder
layer (:mod:`transduce.training.guided`, ``train.guided_alignment_weight`` ``--weight``). The test
pairs are the toy corpus's test split (no English sentence of the training split). Both are then force-decoded on the
test pairs' references and aligned by :func:`~transduce.inference.text.alignment.hard_alignment`.
Reported (one JSON object): AER of the unguided model at the default setting (penultimate layer,
mean of heads) and at its best layer/head, AER of the guided head (the one the guided model's
saved decode settings name, which ``translate --output-format jsonl`` reads), and each model's
test per-token NLL (the price of guidance in translation quality).

``--dry`` trains a few steps on a few sentences (CI, so the benchmark never rots).

Usage:
    python bench/alignment.py [--steps 600] [--train-size 3000] [--test-size 200] [--weight 1.0] [--threads 2]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from transduce.config import RunConfig
from transduce.data import toy
from transduce.data.tokenizer import Tokenizer, load_tokenizer
from transduce.data.toy_grammar import lexicon
from transduce.evaluation.metrics import alignment_error_rate
from transduce.inference.text.alignment import alignment_choice, format_alignment, hard_alignment
from transduce.inference.search import AttentionChoice
from transduce.inference.search.forced import force_decode
from transduce.model import Transformer, load_model
from transduce.data.batch import pad
from transduce.training.loop import run_training

def _lemmas() -> tuple[dict[str, str], dict[str, str]]:
    """English and German word forms (lowercase) -> lemma key; forms of two lemmas are left out."""
    lex = lexicon()
    en: dict[str, set[str]] = {}
    de: dict[str, set[str]] = {}
    for n in lex.nouns:
        for f in (n.en, n.en_pl):
            en.setdefault(f, set()).add(f"n:{n.en}")
        for f in (n.de, n.de_pl, n.de_dat_pl):
            de.setdefault(f.lower(), set()).add(f"n:{n.en}")
    for v in lex.verbs:
        for f in (v.en, v.en_3sg, v.en_part):
            en.setdefault(f, set()).add(f"v:{v.en}")
        for f in (v.de, v.de_1sg, v.de_3sg, v.de_part):
            de.setdefault(f.lower(), set()).add(f"v:{v.en}")
    for e, d in lex.time_adverbs + lex.manner_adverbs:
        if " " not in e and " " not in d:
            en.setdefault(e, set()).add(f"a:{e}")
            de.setdefault(d.lower(), set()).add(f"a:{e}")
    return ({f: next(iter(k)) for f, k in en.items() if len(k) == 1},
            {f: next(iter(k)) for f, k in de.items() if len(k) == 1})


def lexicon_links(en: str, de: str, lemmas=None) -> list[tuple[int, int]]:
    """The reference links of a toy pair: word i - word j when both are forms of one lexicon
    lemma that occurs once on each side (words are whitespace tokens, punctuation stripped)."""
    en_of, de_of = lemmas or _lemmas()
    src = [en_of.get(w.strip(",.?").lower()) for w in en.split()]
    tgt = [de_of.get(w.strip(",.?").lower()) for w in de.split()]
    return sorted((i, tgt.index(k)) for i, k in enumerate(src)
                  if k is not None and src.count(k) == 1 and tgt.count(k) == 1)


def encode_pairs(tok: Tokenizer, pairs: list[tuple[str, str]]) -> list[tuple[list[int], list[int]]]:
    return [(tok.encode(s, "src"), tok.encode(t, "tgt")) for s, t in pairs]


def run_config(steps: int, train_size: int, test_size: int, weight: float, seed: int, threads: int,
               align_file: Path | None) -> RunConfig:
    """The ``transduce train`` config of one model: a tiny Transformer on the toy pair, Adam at a
    constant 2e-3 after 100 warmup steps, batches of about 32 pairs (a 512-token budget); with
    ``align_file``, guided alignment training on head 0 of the penultimate decoder layer."""
    return RunConfig.from_dict({
        "model": {"d_model": 64, "n_heads": 4, "n_encoder_layers": 2, "n_decoder_layers": 2, "d_ff": 256,
                  "dropout": 0.0, "max_positions": 128},
        "data": {"corpus": "toy", "toy_seed": seed, "toy_train_size": train_size, "toy_valid_size": 20,
                 "toy_test_size": test_size, "vocab_size": 600, "max_len": 100, "max_tokens": 512,
                 "train_alignments": None if align_file is None else str(align_file)},
        "train": {"seed": seed, "max_steps": steps, "schedule": "constant", "lr": 2e-3, "warmup_steps": 100,
                  "clip_norm": 1.0, "guided_alignment_weight": weight, "eval_every": steps, "save_every": steps,
                  "eval_bleu": False, "log_every": max(steps // 10, 1), "threads": threads},
        "decode": {"alignment_layer": -2}})


def train(cfg: RunConfig, run_dir: Path) -> tuple[Transformer, Tokenizer, RunConfig]:
    """A model trained by the trainer ``transduce train`` runs; its tokenizer and saved decode settings."""
    trainer, _ = run_training(cfg, run_dir)
    return load_model(run_dir / "model").eval(), load_tokenizer(run_dir / "model"), trainer.cfg


def aer(model: Transformer, tok: Tokenizer, data, refs, choice: AttentionChoice) -> tuple[float, float]:
    """AER over the annotated source words and the per-token NLL, forcing the references."""
    eos = model.config.eos_id
    predicted, nll, tokens = [], 0.0, 0
    for start in range(0, len(data), 64):
        rows = data[start:start + 64]
        src = pad([s + [eos] for s, _ in rows], model.config.pad_id)
        tgt = pad([t + [eos] for _, t in rows], model.config.pad_id)
        out = force_decode(model, src, tgt, attention=choice)
        nll -= float(out.log_probs.sum())
        tokens += int(out.lengths.sum())
        for row, (s, t) in enumerate(rows):
            links = hard_alignment(out.cross_attention[row], tok.pieces(s, "src"), tok.pieces(t, "tgt"))
            annotated = {i for i, _ in refs[start + row]}
            predicted.append([(i, j) for i, j in links if i in annotated])
    return alignment_error_rate(predicted, refs), nll / tokens


def run(steps: int, train_size: int, test_size: int, weight: float, seed: int = 0, threads: int = 2) -> dict:
    splits = toy.make_splits(seed=seed, n_train=train_size, n_valid=20, n_test=test_size)
    lemmas = _lemmas()
    refs = [lexicon_links(s, t, lemmas) for s, t in splits["test"]]
    with tempfile.TemporaryDirectory() as tmp:
        align_file = Path(tmp) / "train.align"  # the user's side: a Pharaoh file parallel to the training pairs
        align_file.write_text("".join(format_alignment(lexicon_links(s, t, lemmas)) + "\n"
                                      for s, t in splits["train"]))
        t0 = time.perf_counter()
        sizes = (steps, train_size, test_size, weight, seed, threads)
        plain, tok, _ = train(run_config(*sizes, None), Path(tmp) / "plain")
        guided, guided_tok, guided_cfg = train(run_config(*sizes, align_file), Path(tmp) / "guided")
        train_s = time.perf_counter() - t0
    test, guided_test = encode_pairs(tok, splits["test"]), encode_pairs(guided_tok, splits["test"])
    layers, heads = plain.config.n_decoder_layers, plain.config.n_heads
    choice = alignment_choice(guided.config, guided_cfg.decode)  # what translate --output-format jsonl reads
    with torch.inference_mode():
        default, plain_nll = aer(plain, tok, test, refs, AttentionChoice(-2, None))
        best = min((aer(plain, tok, test, refs, AttentionChoice(layer, head))[0], layer, head)
                   for layer in range(layers) for head in [None, *range(heads)])
        guided_aer, guided_nll = aer(guided, guided_tok, guided_test, refs, choice)
    return {"unguided_aer": round(default, 4), "unguided_best_aer": round(best[0], 4),
            "unguided_best_choice": {"layer": best[1], "head": best[2]}, "guided_aer": round(guided_aer, 4),
            "guided_choice": {"layer": choice.layer, "head": choice.head}, "unguided_test_nll": round(plain_nll, 4),
            "guided_test_nll": round(guided_nll, 4), "reference_links": sum(map(len, refs)),
            "test_pairs": len(test), "train_pairs": train_size, "steps": steps, "weight": weight,
            "train_s_both": round(train_s, 1)}


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=os.path.dirname(os.path.abspath(__file__)), check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=600, help="Adam steps of about 32 pairs, per model")
    p.add_argument("--train-size", type=int, default=3000)
    p.add_argument("--test-size", type=int, default=200)
    p.add_argument("--weight", type=float, default=1.0, help="the guided alignment loss's weight")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dry", action="store_true", help="a few steps on a few sentences (CI)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.dry:
        args.steps, args.train_size, args.test_size = 3, 100, 10
    result = run(args.steps, args.train_size, args.test_size, args.weight, args.seed, args.threads)
    result.update({"date": datetime.date.today().isoformat(), "commit": _commit(), "threads": args.threads,
                   "machine": f"{platform.machine()} {platform.processor() or ''}".strip(), "cpus": os.cpu_count()})
    json.dump(result, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
