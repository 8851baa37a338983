"""``transduce demo --task t5``: T5's recipe (Raffel et al., 2020) in small, offline.

1. Span-corruption pretraining (``train.task: span``, ``demo_t5.yaml``) of a small T5 on the
   English and German sentences of the embedded toy pair's training split, as one monolingual
   text: 15% of each sentence dropped in spans, the model asked for them back.
2. Text-to-text fine-tuning (``data.corpus: tsv``, ``demo_t5_finetune.yaml``) of that model on two
   tasks in one file: ``translate English to German: `` + an English sentence -> its German, and
   ``classify tense: `` + an English sentence -> the tense of its main clause (``present``,
   ``perfect``, ``future`` or ``modal``: learnable, since the grammar generates the tense, and not
   one word at one place, see :func:`~transduce.data.toy.make_tense_splits`). The first
   :data:`TENSE_SENTENCES` training sentences are labelled; every training pair is translated.
3. Each task's test score (beam 4): BLEU for translation, accuracy for the tense, on the toy
   test split's 500 sentences each; ``demo.json`` holds them.

Finished runs in ``OUT/pretrain`` and ``OUT/finetune`` are reused, as the other demos do.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from .atomic import atomic_write_text
from .config import RunConfig
from .data.corpus import read_tsv_chunks
from .data.toy import make_splits, make_tense_splits
from .demo import shipped_config
from .evaluation.text2text import task_scores
from .inference.translator import Translator
from .training.checkpoint import latest_checkpoint
from .training.loop import run_training

TRANSLATE, TENSE = "translate English to German: ", "classify tense: "  # the tasks' prefixes
TENSE_SENTENCES = 10000  # labelled training sentences of the tense task (the first of the toy training split)
TOY_SPLITS = {"n_train": 20000, "n_valid": 500, "n_test": 500}  # the toy pair's default splits


@dataclass
class T5DemoResult:
    run_dir: Path
    scores: dict[str, dict[str, float]]  # task -> {"bleu" or "acc": test score, "n": sentences}
    pretrain_ppl: float                  # span corruption's validation perplexity of the dropped spans
    seconds: float

    def report(self) -> str:
        lines = [f"span-corruption pretraining: validation perplexity of the dropped spans {self.pretrain_ppl:.2f}",
                 "text-to-text fine-tuning, held-out toy test (beam 4):"]
        for task, s in self.scores.items():
            score = f"BLEU {s['bleu']:.1f}" if "bleu" in s else f"accuracy {s['acc']:.3f}"
            lines.append(f"  {task + ':':<30} {score} ({int(s['n'])} sentences)")
        model = self.run_dir / "finetune" / "model"
        lines += [f"{self.seconds:.0f} s in all", "",
                  f"model: {model}  (try: echo '{TENSE}The dog will sleep.' | transduce translate {model})"]
        return "\n".join(lines)


def t5_demo_configs(run_dir: Path, steps: int | None = None) -> tuple[RunConfig, RunConfig]:
    """The pretraining and fine-tuning configs (``demo_t5.yaml``, ``demo_t5_finetune.yaml``) over
    the files :func:`write_t5_data` writes into ``run_dir/data``; ``steps`` caps both runs."""
    pre, fine = shipped_config("demo_t5.yaml"), shipped_config("demo_t5_finetune.yaml")
    data = run_dir / "data"
    pre["data"].update({f"{k}_tgt": str(data / f"{k}.txt") for k in ("train", "valid")})
    fine["data"].update({f"{k}_src": str(data / f"{k}.tsv") for k in ("train", "valid", "test")},
                        tokenizer=str(run_dir / "pretrain" / "model"))
    fine = {"model": pre["model"], "data": fine["data"],
            "train": {**fine["train"], "init_from": str(run_dir / "pretrain" / "model")}}
    threads = min(os.cpu_count() or 1, 4)
    for d in (pre, fine):
        d["train"].update(threads=threads, **({"max_steps": steps} if steps is not None else {}))
    return RunConfig.from_dict(pre), RunConfig.from_dict(fine)


def write_t5_data(run_dir: Path) -> None:
    """The toy pair (:data:`TOY_SPLITS`) as the demo's files in ``run_dir/data``: ``train.txt`` and
    ``valid.txt`` (each English sentence, then its German: the pretraining text) and
    ``{train,valid,test}.tsv`` (the two tasks' ``input<TAB>target`` lines; validation and test
    alternate the tasks line by line)."""
    pairs, tenses = make_splits(**TOY_SPLITS), make_tense_splits(**TOY_SPLITS)
    (run_dir / "data").mkdir(parents=True, exist_ok=True)
    for name in ("train", "valid"):
        atomic_write_text(run_dir / "data" / f"{name}.txt",
                          "".join(f"{en}\n{de}\n" for en, de in pairs[name]))
    for name, rows in pairs.items():
        translate = [f"{TRANSLATE}{en}\t{de}\n" for en, de in rows]
        classify = [f"{TENSE}{en}\t{tense}\n" for en, tense in tenses[name]]
        if name == "train":
            lines = translate + classify[:TENSE_SENTENCES]
        else:
            lines = [line for both in zip(translate, classify) for line in both]
        atomic_write_text(run_dir / "data" / f"{name}.tsv", "".join(lines))


def run_t5_demo(out: str | os.PathLike = "runs/demo_t5", steps: int | None = None) -> T5DemoResult:
    """Pretrain by span corruption, fine-tune text-to-text on two toy tasks, score each task's test."""
    t0 = time.monotonic()
    run_dir = Path(out)
    pretrain, finetune = t5_demo_configs(run_dir, steps)
    write_t5_data(run_dir)
    metrics = {}
    for name, cfg in (("pretrain", pretrain), ("finetune", finetune)):
        resume = latest_checkpoint(run_dir / name / "checkpoints") is not None
        metrics[name] = run_training(cfg, run_dir / name, resume=resume)[1]
    test = [(s.decode()[:-1], t.decode()[:-1]) for src, tgt in read_tsv_chunks(finetune.data.test_src)
            for s, t in zip(src, tgt)]
    with Translator.load(run_dir / "finetune" / "model") as translator:  # beam 4, lenpen 0.6
        hyps = translator.translate([s for s, _ in test])
    scores = task_scores([s for s, _ in test], hyps, [t for _, t in test])
    result = T5DemoResult(run_dir, scores, metrics["pretrain"]["val_ppl"], time.monotonic() - t0)
    summary = {"test": scores, "pretrain_val_ppl": result.pretrain_ppl,
               "steps": {"pretrain": pretrain.train.max_steps, "finetune": finetune.train.max_steps},
               "tense_sentences": TENSE_SENTENCES, "seconds": result.seconds}
    atomic_write_text(run_dir / "demo.json", json.dumps(summary, indent=1) + "\n")
    return result
