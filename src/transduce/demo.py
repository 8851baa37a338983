"""``transduce demo``: the whole pipeline on the embedded toy English->German pair, offline.

``--task lm`` trains a small GPT (``demo_lm.yaml``) on the pair's German side instead and
reports validation perplexity and a few generated sentences; ``--task mlm`` a small BERT
(``demo_mlm.yaml``) on the English side, reporting validation perplexity of the masked tokens
and its guesses for one masked token in a few test sentences; ``--task classify`` fine-tunes
that BERT to classify toy sentences by the tense of their main clause and compares it with the
same classifier trained from scratch.

Generates the toy corpus, trains a small Transformer with the paper's recipe (post-LN,
sinusoidal positions, shared embeddings, label smoothing 0.1, Adam(0.9, 0.98, 1e-9) with the
warmup / inverse-square-root schedule), then translates the held-out test split with beam 4
and length penalty 0.6, prints BLEU and examples, and saves the model and an attention picture.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path

import torch
import yaml

from .atomic import atomic_write_text
from .config import TASKS, GenerationConfig, RunConfig
from .data.corpus import read_lines
from .data.prepare import split_sources
from .data.prepared import TokenPairs, length_dtype, token_dtype
from .data.tokenizer import load_tokenizer
from .data.toy import TENSE_LABELS, make_tense_splits, write_splits
from .errors import TransduceError
from .evaluation.heldout import next_sentence_accuracy
from .evaluation.metrics import classification_scores, evaluate
from .inference.analysis.attention_maps import attention_maps
from .inference.classify import Classifier
from .inference.generate import Generator
from .inference.translator import Translator
from .model.io import load_model, saved_model_settings
from .training.checkpoint import latest_checkpoint
from .training.loop import run_training
from .viz.attention_heatmaps import plot_attention

logger = logging.getLogger(__name__)


@dataclass
class DemoResult:
    run_dir: Path
    bleu: float
    chrf: float
    seconds: float
    train_seconds: float
    examples: list[tuple[str, str, str]] = field(default_factory=list)
    attention_png: Path | None = None

    def report(self) -> str:
        lines = [f"held-out toy test BLEU {self.bleu:.1f}, chrF {self.chrf:.1f} (beam 4, lenpen 0.6); "
                 f"trained in {self.train_seconds:.0f} s, {self.seconds:.0f} s in all", ""]
        for src, ref, hyp in self.examples:
            lines += [f"  source     {src}", f"  reference  {ref}", f"  transduce  {hyp}", ""]
        lines.append(f"model: {self.run_dir / 'model'}  (try: transduce translate {self.run_dir / 'model'})")
        if self.attention_png is not None:
            lines.append(f"attention: {self.attention_png}")
        return "\n".join(lines)


@dataclass
class LMDemoResult:
    run_dir: Path
    val_ppl: float
    seconds: float
    samples: list[str] = field(default_factory=list)

    def report(self) -> str:
        lines = [f"toy German validation perplexity {self.val_ppl:.2f}; {self.seconds:.0f} s in all", "",
                 "greedy, then sampled (temperature 0.8, top-p 0.9, seed 0):"]
        lines += [f"  {s}" for s in self.samples]
        lines += ["", f"model: {self.run_dir / 'model'}  (try: transduce generate {self.run_dir / 'model'} "
                  "--prompt 'der Hund')"]
        return "\n".join(lines)


@dataclass
class MLMDemoResult:
    run_dir: Path
    val_ppl: float
    seconds: float
    fills: list[tuple[str, str, str]] = field(default_factory=list)  # (masked sentence, masked piece, guess)
    nsp_accuracy: float | None = None  # next-sentence accuracy on the test documents (demo --nsp)

    def report(self) -> str:
        lines = [f"validation perplexity of the masked tokens {self.val_ppl:.2f}; {self.seconds:.0f} s in all"]
        if self.nsp_accuracy is not None:
            lines.append(f"next-sentence prediction on the test documents: accuracy {self.nsp_accuracy:.3f} "
                         "(chance 0.5)")
        lines += ["", "one token masked, the model's guess:"]
        lines += [f"  {masked}\n    masked {truth!r}, guessed {guess!r}" for masked, truth, guess in self.fills]
        lines += ["", f"model: {self.run_dir / 'model'}  (try: transduce export {self.run_dir / 'model'} "
                  "--format hf --out bert)"]
        return "\n".join(lines)


@dataclass
class ClassifyDemoResult:
    run_dir: Path
    accuracy: dict[str, float]    # test accuracy: "pretrained" (fine-tuned from the masked LM), "scratch"
    baselines: dict[str, float]   # test accuracy of the majority class and of the best single word position
    labelled: int                 # labelled training sentences
    seconds: float

    def report(self) -> str:
        a, b = self.accuracy, self.baselines
        lines = [f"toy sentences classified by the tense of their main clause (4 classes, {self.labelled:,} labelled "
                 f"training sentences); held-out test accuracy:",
                 f"  fine-tuned from the masked LM  {a['pretrained']:.3f}",
                 f"  trained from scratch           {a['scratch']:.3f}  (the same model, data and steps)",
                 f"  baselines: majority class {b['majority']:.3f}, best single word position "
                 f"{b['position']:.3f}",
                 f"{self.seconds:.0f} s in all", "",
                 f"model: {self.run_dir / 'pretrained' / 'best'}  (try: echo 'The dog will sleep.' | "
                 f"transduce classify {self.run_dir / 'pretrained' / 'best'})"]
        return "\n".join(lines)


DEMO_CONFIGS = {"translation": "demo.yaml", "lm": "demo_lm.yaml", "mlm": "demo_mlm.yaml",
                "classify": "demo_classify.yaml"}
LABELLED_SENTENCES = 2000  # the classify demo's labelled training set: the first of the toy training split


def shipped_config(name: str) -> dict:
    return yaml.safe_load(resources.files("transduce").joinpath(name).read_text(encoding="utf-8"))


def demo_config(steps: int | None = None, task: str = "translation", data: dict | None = None,
                init_from: str | None = None, nsp: bool = False) -> RunConfig:
    """The demo's run config: ``demo.yaml`` (``demo_lm.yaml``... for the other tasks) shipped in
    the package, with the step count and this machine's thread count (at most 4).

    ``classify``: ``demo_mlm.yaml`` with ``demo_classify.yaml``'s changes, ``data`` keys added
    (the labelled files, the tokenizer) and ``train.init_from``; the model's shape is the
    ``init_from`` model's, whatever it is (an imported BERT or RoBERTa too), else ``demo_mlm.yaml``'s,
    and sentences are cut to fit its positions. ``mlm`` with ``nsp``: BERT's
    next-sentence head and two token types too, trained on the ``data`` files (:func:`nsp_documents`).
    """
    d = shipped_config(DEMO_CONFIGS[task])
    if nsp:
        d["model"].update(nsp=True, type_vocab_size=2)
        d["data"] = {**{k: v for k, v in d["data"].items() if k != "corpus"}, "corpus": "files", **(data or {})}
    if TASKS[task].labelled:
        changes, d = d, shipped_config(DEMO_CONFIGS["mlm"])
        shape = saved_model_settings(init_from) if init_from is not None else None
        # a new classification head: the starting model's own head or next-sentence head is not kept
        d["model"] = {**(shape or d["model"]), **changes["model"], "labels": [], "nsp": False}
        d["data"] = {**changes["data"], **(data or {})}
        d["data"]["max_len"] = min(d["data"]["max_len"], d["model"]["max_positions"] - 2)  # [CLS] text [SEP]
        d["train"].update(changes["train"], init_from=init_from)
    if steps is not None:
        d["train"]["max_steps"] = steps
    d["train"]["threads"] = min(os.cpu_count() or 1, 4)
    return RunConfig.from_dict(d)


def run_demo(out: str | os.PathLike = "runs/demo", steps: int | None = None) -> DemoResult:
    """Train (or, if ``out`` already holds the finished run, reuse) and evaluate the demo model."""
    t0 = time.monotonic()
    run_dir = Path(out)
    cfg = demo_config(steps)
    resume = latest_checkpoint(run_dir / "checkpoints") is not None
    trainer, _ = run_training(cfg, run_dir, resume=resume)
    train_seconds = time.monotonic() - t0
    translator = Translator.load(run_dir / "model")
    texts = {k: list(v.text_pairs()) for k, v in split_sources(cfg.data).items()}
    test = texts["test"]
    write_splits(run_dir / "data", texts)  # the corpus as files, for `transduce translate/evaluate`
    sources, refs = [s for s, _ in test], [t for _, t in test]
    scores = evaluate(translator, sources, refs)  # the paper's beam 4, lenpen 0.6 (DecodeConfig defaults)
    hyps = translator.translate(sources[:4])
    examples = list(zip(sources[:4], refs[:4], hyps))
    png = _attention_picture(translator, sources[0], run_dir / "attention.png")
    result = DemoResult(run_dir, scores["bleu"], scores["chrf"], time.monotonic() - t0, train_seconds, examples, png)
    summary = {"bleu": result.bleu, "chrf": result.chrf, "bleu_signature": scores.get("bleu_signature"),
               "seconds": result.seconds, "train_seconds": train_seconds, "steps": trainer.state.step,
               "test_sentences": len(test)}
    atomic_write_text(run_dir / "demo.json", json.dumps(summary, indent=1) + "\n")
    return result


def run_lm_demo(out: str | os.PathLike = "runs/demo_lm", steps: int | None = None) -> LMDemoResult:
    """Train (or reuse a finished run in ``out``) a small GPT on the toy German sentences; report
    validation perplexity and a few continuations of test-sentence openings."""
    t0 = time.monotonic()
    run_dir = Path(out)
    cfg = demo_config(steps, task="lm")
    resume = latest_checkpoint(run_dir / "checkpoints") is not None
    trainer, metrics = run_training(cfg, run_dir, resume=resume)
    generator = Generator.load(run_dir / "model")
    test = [t for _, t in split_sources(cfg.data)["test"].text_pairs()]
    prompts = [" ".join(t.split()[:2]) for t in test[:3]]
    samples = generator.generate(["", *prompts[:1]], GenerationConfig(max_new_tokens=30, temperature=0))
    samples += generator.generate(prompts, GenerationConfig(max_new_tokens=30, temperature=0.8, top_p=0.9, seed=0))
    result = LMDemoResult(run_dir, metrics["val_ppl"], time.monotonic() - t0, samples)
    summary = {"val_ppl": result.val_ppl, "seconds": result.seconds, "steps": trainer.state.step}
    atomic_write_text(run_dir / "demo.json", json.dumps(summary, indent=1) + "\n")
    return result


def nsp_documents(run_dir: Path) -> dict[str, str]:
    """The toy English sentences as documents for next-sentence prediction, written into
    ``run_dir/data``: each split's sentences grouped by the tense of their main clause (stable),
    so that a line's successor shares its tense and a random line does so a quarter of the time;
    the ``data.*_tgt`` keys of the files."""
    toy = demo_config(task="mlm").data
    rank = {label: i for i, label in enumerate(dict.fromkeys(TENSE_LABELS.values()))}
    files = {}
    (run_dir / "data").mkdir(parents=True, exist_ok=True)
    for name, rows in make_tense_splits(toy.toy_seed, toy.toy_train_size, toy.toy_valid_size,
                                        toy.toy_test_size).items():
        files[f"{name}_tgt"] = str(run_dir / "data" / f"{name}.txt")
        ordered = sorted(rows, key=lambda row: rank[row[1]])
        atomic_write_text(files[f"{name}_tgt"], "".join(f"{text}\n" for text, _ in ordered))
    return files


def run_mlm_demo(out: str | os.PathLike = "runs/demo_mlm", steps: int | None = None,
                 nsp: bool = False) -> MLMDemoResult:
    """Train (or reuse a finished run in ``out``) a small BERT on the toy English sentences; report
    validation perplexity and its guess for the middle token of a few test sentences. With
    ``nsp`` also BERT's next-sentence prediction, on the sentences as documents of one tense
    (:func:`nsp_documents`), reporting its accuracy on the test split."""
    t0 = time.monotonic()
    run_dir = Path(out)
    cfg = demo_config(steps, task="mlm", data=nsp_documents(run_dir) if nsp else None, nsp=nsp)
    resume = latest_checkpoint(run_dir / "checkpoints") is not None
    trainer, metrics = run_training(cfg, run_dir, resume=resume)
    model, tok = load_model(run_dir / "model"), load_tokenizer(run_dir / "model")
    nsp_accuracy = _nsp_accuracy(model, tok, cfg) if nsp else None
    fills = []
    for text, _ in list(split_sources(cfg.data)["test"].text_pairs())[:4]:
        ids = [model.config.bos_id, *tok.encode(text, "src"), model.config.eos_id]
        i = len(ids) // 2
        masked = ids[:i] + [model.mask_id] + ids[i + 1:]
        with torch.no_grad():
            guess = int(model.mlm_logits(model(torch.tensor([masked])))[0, i, :model.mask_id].argmax())
        shown = tok.decode(ids[1:i], "src") + " [MASK] " + tok.decode(ids[i + 1:-1], "src")
        fills.append((shown, tok.pieces([ids[i]], "src")[0], tok.pieces([guess], "src")[0]))
    result = MLMDemoResult(run_dir, metrics["val_ppl"], time.monotonic() - t0, fills, nsp_accuracy)
    summary = {"val_ppl": result.val_ppl, "seconds": result.seconds, "steps": trainer.state.step,
               **({"nsp_test_accuracy": nsp_accuracy} if nsp else {})}
    atomic_write_text(run_dir / "demo.json", json.dumps(summary, indent=1) + "\n")
    return result


def _nsp_accuracy(model, tok, cfg: RunConfig) -> float:
    """Next-sentence accuracy on the test split's documents."""
    rows = [tok.encode(line, "src")[:cfg.data.max_len] for line in read_lines(cfg.data.test_tgt)]
    pairs = TokenPairs.from_rows(rows, rows, token_dtype(model.config.src_vocab_size), length_dtype(cfg.data.max_len))
    return next_sentence_accuracy(model, pairs, cfg.train.seed)


def run_classify_demo(out: str | os.PathLike = "runs/demo_classify", steps: int | None = None,
                      init_from: str | os.PathLike | None = None) -> ClassifyDemoResult:
    """Classify toy sentences by the tense of their main clause: fine-tune the masked LM of
    :func:`run_mlm_demo` (trained into ``out/mlm``, or ``init_from``, a finished one's model
    directory) and train the same classifier from scratch, the same steps on the same
    :data:`LABELLED_SENTENCES`; report both test accuracies. ``steps`` caps every run (the
    masked LM's too). Finished runs in ``out`` are reused."""
    t0 = time.monotonic()
    run_dir = Path(out)
    mlm = Path(init_from) if init_from is not None else run_mlm_demo(run_dir / "mlm", steps).run_dir / "model"
    toy_data = demo_config(task="mlm").data  # the masked LM's sentences, now labelled
    splits = make_tense_splits(toy_data.toy_seed, toy_data.toy_train_size, toy_data.toy_valid_size,
                               toy_data.toy_test_size, n_labelled=LABELLED_SENTENCES)
    files = {}
    (run_dir / "data").mkdir(parents=True, exist_ok=True)
    for name, rows in splits.items():
        files[f"{name}_src"] = str(run_dir / "data" / f"{name}.tsv")
        atomic_write_text(files[f"{name}_src"], "".join(f"{text}\t{label}\n" for text, label in rows))
    accuracy = {}
    test_texts, gold = [t for t, _ in splits["test"]], [label for _, label in splits["test"]]
    shaped = demo_config(steps, "classify", data={**files, "tokenizer": str(mlm)}, init_from=str(mlm))
    for name, start in (("pretrained", str(mlm)), ("scratch", None)):  # the same model, initialised or not
        cfg = replace(shaped, train=replace(shaped.train, init_from=start))
        resume = latest_checkpoint(run_dir / name / "checkpoints") is not None
        run_training(cfg, run_dir / name, resume=resume)
        predicted = Classifier.load(run_dir / name / "best").classify(test_texts)
        accuracy[name] = classification_scores(predicted, gold)["accuracy"]
    baselines = position_baselines(splits["train"], splits["test"])
    result = ClassifyDemoResult(run_dir, accuracy, baselines, len(splits["train"]), time.monotonic() - t0)
    summary = {"test_accuracy": accuracy, "baselines": baselines, "labelled_sentences": result.labelled,
               "test_sentences": len(gold), "steps": cfg.train.max_steps, "seconds": result.seconds}
    atomic_write_text(run_dir / "demo.json", json.dumps(summary, indent=1) + "\n")
    return result


def position_baselines(train: list[tuple[str, str]], test: list[tuple[str, str]]) -> dict[str, float]:
    """Test accuracy of two label-reading shortcuts learnt from ``train``: the majority class, and
    the best of "the most frequent label of the word at position i" over word positions i (no
    word past the end counts as a word). How far a task is from being read off one place."""
    majority = Counter(label for _, label in train).most_common(1)[0][0]
    best = 0.0
    for i in range(max(len(text.split()) for text, _ in train)):
        table: dict[str | None, Counter] = defaultdict(Counter)
        for text, label in train:
            table[_word(text, i)][label] += 1
        guess = {word: c.most_common(1)[0][0] for word, c in table.items()}
        best = max(best, sum(guess.get(_word(t, i), majority) == label for t, label in test) / len(test))
    return {"majority": sum(label == majority for _, label in test) / len(test), "position": best}


def _word(text: str, i: int) -> str | None:
    words = text.split()
    return words[i] if i < len(words) else None


def _attention_picture(translator, sentence: str, path: Path) -> Path | None:
    """Cross/self-attention heatmaps of one sentence, if matplotlib is installed."""
    try:
        return plot_attention(attention_maps(translator, sentence), path)
    except TransduceError as e:  # matplotlib missing: the demo still succeeds
        logger.warning("no attention picture: %s", e)
        return None
