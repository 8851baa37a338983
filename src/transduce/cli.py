"""Command-line interface: parses arguments and calls the library; nothing else.

User errors (:class:`~transduce.errors.TransduceError`) are printed as one line on stderr and
exit with status 2.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
import errno
import logging
import sys
from pathlib import Path

from . import __version__
from . import progress
from .config import EXTEND_VOCAB
from .errors import ConfigError, TransduceError


def _add_config(p: argparse.ArgumentParser, help: str) -> None:
    p.add_argument("config", nargs="?", help=help)
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a config value (repeatable)")


def _add_train(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a model from a YAML config")
    _add_config(p, "run config (YAML); defaults if omitted")
    p.add_argument("--out", default=None, help="run directory (default: runs/<name>)")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --out")
    p.add_argument("--reverse", action="store_true",
                   help="train the other direction: swap the config's source and target (e.g. de->en)")
    p.add_argument("--init-from", default=None, metavar="MODEL_DIR",
                   help="start from a trained model's weights and tokenizer (same as --set train.init_from=MODEL_DIR)")
    p.add_argument("--extend-vocab", nargs="?", type=int, const=EXTEND_VOCAB, default=None, metavar="N",
                   help="with --init-from: add up to N subwords of the new training data the model's tokenizer "
                        f"lacks (default {EXTEND_VOCAB} per tokenizer model), keeping every existing id and "
                        "embedding; the grown tokenizer is written to OUT/tokenizer (same as --set "
                        "train.extend_vocab=N). Put it after CONFIG")
    p.set_defaults(func=_cmd_train)


def _cmd_train(args: argparse.Namespace) -> int:
    return train_main(args.config, args.overrides, args.out, args.resume, args.reverse, args.init_from,
                      args.extend_vocab)


def default_run_dir(config_path: str | None, reverse: bool = False) -> Path:
    return Path("runs") / ((Path(config_path).stem if config_path else "run") + ("_reverse" if reverse else ""))


def train_main(config_path: str | None, overrides: list[str], out: str | None, resume: bool,
               reverse: bool = False, init_from: str | None = None, extend_vocab: int | None = None) -> int:
    """``transduce train``: returns the process exit status."""
    from .config import load_run_config
    from .model.io import saved_model_settings
    from .training import loop

    run_dir = Path(out) if out else default_run_dir(config_path, reverse)
    if resume and config_path is None and (run_dir / "config.yaml").is_file():
        config_path = str(run_dir / "config.yaml")  # resume with the run's own config
    if reverse:  # idempotent: a reversed run's own config already says so
        overrides = [*overrides, "data.reverse=true"]
    if init_from is not None:
        overrides = [*overrides, f"train.init_from={init_from}"]
    if extend_vocab is not None:
        overrides = [*overrides, f"train.extend_vocab={extend_vocab}"]
    loop.run_training(load_run_config(config_path, overrides, saved_model_settings), run_dir, resume)
    return 0


def _add_prepare(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("prepare", help="encode a config's corpus once into token files that train opens")
    _add_config(p, "run config (YAML; its data section is used); defaults if omitted")
    p.add_argument("--out", required=True, help="directory to create (written atomically)")
    p.add_argument("--workers", type=int, default=None, help="encoding processes (default: one per core)")
    p.set_defaults(func=_cmd_prepare)


def _cmd_prepare(args: argparse.Namespace) -> int:
    from .config import load_run_config
    from .data.prepare import prepare_dataset
    from .model.io import saved_model_settings
    cfg = load_run_config(args.config, args.overrides, saved_model_settings).with_init_tokenizer()
    data = prepare_dataset(cfg.data, args.out, args.workers, seed=cfg.train.seed)
    m = data.manifest
    for split, entry in m["splits"].items():
        f = entry["filter"]
        print(f"{split}: kept {entry['pairs']:,} of {sum(f.values()):,} pairs, "
              f"{entry['src_tokens']:,} + {entry['tgt_tokens']:,} tokens")
    print(f"prepared {args.out} in {m['seconds']:.1f} s; train on it with: --set data.prepared={args.out}")
    return 0


def _add_demo(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="train and evaluate on the embedded toy language pair (no download)")
    p.add_argument("--task", default="translation", choices=["translation", "lm", "mlm", "classify"],
                   help="translation (en->de), lm: a small GPT on the German side, mlm: a small BERT on the "
                        "English side, or classify: that BERT fine-tuned to tell the tense of a sentence, against "
                        "the same classifier from scratch (default: translation)")
    p.add_argument("--out", default=None, help="run directory (default: runs/demo, or runs/demo_TASK)")
    p.add_argument("--steps", type=int, default=None,
                   help="training steps (default: the demo's own); for classify, of each of its runs")
    p.add_argument("--init-from", default=None, metavar="MODEL_DIR",
                   help="classify: fine-tune this masked LM (a finished `demo --task mlm` model) instead of "
                        "training one into OUT/mlm")
    p.set_defaults(func=_cmd_demo)


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_classify_demo, run_demo, run_lm_demo, run_mlm_demo
    if args.init_from is not None and args.task != "classify":
        raise ConfigError("--init-from: only demo --task classify starts from a trained model")
    if args.task == "classify":
        result = run_classify_demo(args.out or "runs/demo_classify", steps=args.steps, init_from=args.init_from)
    elif args.task == "lm":
        result = run_lm_demo(args.out or "runs/demo_lm", steps=args.steps)
    elif args.task == "mlm":
        result = run_mlm_demo(args.out or "runs/demo_mlm", steps=args.steps)
    else:
        result = run_demo(args.out or "runs/demo", steps=args.steps)
    print(result.report())
    return 0


def _add_average(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("average", help="average the weights of checkpoints (Sec. 6.1)")
    p.add_argument("checkpoints", nargs="+", help="checkpoint or model directories of one config")
    p.add_argument("--out", required=True, help="model directory to write")
    p.set_defaults(func=_cmd_average)


def _cmd_average(args: argparse.Namespace) -> int:
    from .training.checkpoint import average_checkpoints
    out = average_checkpoints([Path(c) for c in args.checkpoints], Path(args.out))
    print(f"averaged {len(args.checkpoints)} checkpoints into {out}")
    return 0


def _add_plot(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plot", help="draw a run's learning curves to PNG (needs matplotlib)")
    p.add_argument("run_dir", help="run directory (reads metrics.jsonl)")
    p.add_argument("--out", default=None, help="PNG path (default: RUN_DIR/curves.png)")
    p.set_defaults(func=_cmd_plot)


def _cmd_plot(args: argparse.Namespace) -> int:
    from .viz.curves import plot_run
    print(plot_run(args.run_dir, args.out))
    return 0


def _add_model_dirs(p: argparse.ArgumentParser, help: str) -> None:
    """The model directory, more of them (an ensemble) and a draft model: what ``load`` takes."""
    p.add_argument("model_dir", help=help)
    p.add_argument("ensemble", nargs="*", metavar="MORE_MODEL_DIRS",
                   help="more model directories of the same tokenizer: decode with the ensemble, their "
                        "token log-probabilities averaged at every step")
    p.add_argument("--draft", default=None, metavar="DRAFT_DIR",
                   help="speculative decoding: a smaller model with the same tokenizer proposes tokens, the model "
                        "checks them in one pass; greedy (--beam 1), same output, faster")


def _add_runtime_options(p: argparse.ArgumentParser, workers: bool = True) -> None:
    """Where and how the model runs (:class:`~transduce.inference.Runtime`), for every command
    that loads one."""
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default: auto)")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"],
                   help="autocast precision (default: fp32)")
    p.add_argument("--int8", action="store_true", help="dynamic int8 quantisation of the linear layers (CPU)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads (default: torch's choice; with --workers: per worker, default 1)")
    if not workers:
        return
    p.add_argument("--workers", type=int, default=0,
                   help="decode on the CPU in N worker processes, batches spread over them (default: 0, "
                        "decode in this process; on a CPU, one worker per core is usually fastest)")
    p.add_argument("--worker-timeout", type=float, default=None, metavar="S",
                   help="with --workers: a batch not answered within S seconds (more for large batches once the "
                        "workers' speed is measured) counts as a hung worker, which is replaced and the batch "
                        "retried once (default: 120)")


def _add_decode_options(p: argparse.ArgumentParser, constraints: bool = False) -> None:
    """Decoding settings; each replaces one of the model directory's saved settings (its
    config.yaml ``decode`` section), those not given keep them. ``constraints``: also where
    constraints come from (the input line, a glossary)."""
    p.add_argument("--beam", type=int, default=None, help="beam size; 1 = greedy (default: the model's, else 4)")
    p.add_argument("--lenpen", type=float, default=None, help="length penalty alpha (default: the model's, else 0.6)")
    p.add_argument("--max-len-a", type=float, default=None, help="max output = A * source_len + B (default A=1)")
    p.add_argument("--max-len-b", type=int, default=None, help="(default B=50)")
    p.add_argument("--batch-tokens", type=int, default=None,
                   help="tokens per batch: source tokens when translating, text tokens when evaluate scores an "
                        "lm or mlm model (default: 4096)")
    p.add_argument("--stop", default=None, choices=["k_finished", "best_finished"],
                   help="when beam search ends a sentence: once K hypotheses finished (fairseq, default), "
                        "or once the best extension ended (CTranslate2; exact with --lenpen 0)")
    p.add_argument("--draft-tokens", type=int, default=None, metavar="K",
                   help="with --draft: tokens the draft proposes per step of the model, at most (default: 4)")
    p.add_argument("--draft-threshold", type=float, default=None, metavar="P",
                   help="with --draft: the draft stops proposing in a step once its latest token's probability is "
                        "below P (default: 0, always K tokens); same output")
    p.add_argument("--no-repeat-ngram-size", type=int, default=None, metavar="N",
                   help="no n-gram of N tokens appears twice in an output (default: 0, off)")
    p.add_argument("--repetition-penalty", type=float, default=None, metavar="P",
                   help="CTRL's repetition penalty on tokens already output: > 1 discourages repeats "
                        "(default: 1.0, off)")
    p.add_argument("--rerank", default=None, type=_rerank_choice, metavar="{none,mbr,reverse:DIR}",
                   help="reorder the --nbest hypotheses: mbr = minimum Bayes risk, by expected --mbr-utility "
                        "against the others; reverse:DIR = noisy channel, the target->source model in DIR scores "
                        "the source given each hypothesis, --reverse-weight times its score is added (translate "
                        "only) (default: none)")
    p.add_argument("--mbr-samples", type=int, default=None, metavar="N",
                   help="with --rerank mbr: choose among N samples (temperature 1) instead of the n-best "
                        "(default: 0, the n-best)")
    p.add_argument("--reverse-weight", type=float, default=None, metavar="W",
                   help="with --rerank reverse:DIR: the reverse model score's weight (default: 1.0)")
    p.add_argument("--mbr-utility", default=None, choices=["chrf", "bleu"],
                   help="with --rerank mbr: the sentence-level utility (default: chrf)")
    if not constraints:
        return
    p.add_argument("--constraints", action="store_true",
                   help="each input line is 'SOURCE<TAB>PHRASE<TAB>PHRASE...': every phrase must appear in its "
                        "translation (constrained beam search, dynamic beam allocation)")
    p.add_argument("--glossary", default=None, metavar="FILE",
                   help="a TSV file of 'source term<TAB>target term' lines: a target term must appear in the "
                        "translation of each sentence whose words contain its source term")
    p.add_argument("--glossary-ignore-case", action="store_true", help="match the glossary's source terms "
                   "regardless of case")


# argparse dest -> DecodeConfig field, for the flags that override the saved decoding settings
DECODE_FLAGS = {"beam": "beam", "lenpen": "lenpen", "max_len_a": "max_len_a", "max_len_b": "max_len_b",
                "batch_tokens": "batch_tokens", "stop": "stop", "nbest": "nbest", "draft_tokens": "draft_tokens",
                "draft_threshold": "draft_threshold", "no_repeat_ngram_size": "no_repeat_ngram_size",
                "repetition_penalty": "repetition_penalty", "rerank": "rerank", "mbr_utility": "mbr_utility",
                "reverse_weight": "reverse_weight", "mbr_samples": "mbr_samples"}


def _rerank_choice(text: str) -> str:
    if text in ("none", "mbr") or (text.startswith("reverse:") and len(text) > len("reverse:")):
        return text
    raise argparse.ArgumentTypeError(f"expected none, mbr or reverse:DIR; got {text!r}")


def decode_overrides(args: argparse.Namespace) -> dict:
    """The decoding settings given on the command line (DecodeConfig field -> value)."""
    out = {field: getattr(args, dest) for dest, field in DECODE_FLAGS.items() if getattr(args, dest, None) is not None}
    if "rerank" in out:  # reverse:DIR is the setting "reverse" and the model the translator's reverse
        out["rerank"] = out["rerank"].split(":", 1)[0]
    return out


def terms_of(args: argparse.Namespace):
    """Where the command line's constraints come from (:class:`~transduce.inference.terms.Terms`)."""
    from .inference.terms import Glossary, Terms
    glossary = None if args.glossary is None else Glossary.load(args.glossary, args.glossary_ignore_case)
    return Terms(args.constraints, glossary)


def runtime_of(args: argparse.Namespace):
    """The :class:`~transduce.inference.Runtime` the command line asks for."""
    from .inference import Runtime
    extra = {} if getattr(args, "worker_timeout", None) is None else {"worker_timeout_s": args.worker_timeout}
    return Runtime(device=args.device, precision=args.precision, int8=args.int8, workers=getattr(args, "workers", 0),
                   threads=args.threads, **extra)


def _load(args: argparse.Namespace):
    """The model directories of the command line, loaded for its runtime (the one front door)."""
    from .inference import load
    if args.worker_timeout is not None and not args.workers:
        raise ConfigError("--worker-timeout: is for --workers")
    if args.draft is not None and args.beam not in (None, 1):
        raise ConfigError(f"--draft: speculative decoding is greedy; got --beam {args.beam} (use --beam 1)")
    translator = load([args.model_dir, *args.ensemble], runtime_of(args), args.draft)
    if (getattr(args, "rerank", None) or "").startswith("reverse:"):
        translator.reverse = load(args.rerank.split(":", 1)[1], replace(runtime_of(args), workers=0))
    if args.draft is not None and translator.settings(**decode_overrides(args)).batch_tokens > 1:
        logging.getLogger("transduce.inference").warning(
            "--draft: a batch advances by its sentences' smallest number of accepted proposals, so speculative "
            "decoding pays one sentence at a time (--batch-tokens 1); for a file's throughput, batched greedy "
            "search without --draft is faster (BENCHMARKS.md, \"Speculative decoding\")")
    return translator


def _add_translate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("translate", help="translate lines of text (stdin to stdout by default)")
    _add_model_dirs(p, "model directory (config.yaml, model.safetensors, tokenizer)")
    p.add_argument("--input", default=None, help="input file, one sentence per line (default: stdin)")
    p.add_argument("--output", default=None, help="output file, written atomically (default: stdout)")
    p.add_argument("--nbest", type=int, default=None,
                   help="K > 1 writes K lines 'SCORE<TAB>TEXT' per input line, best first (default: 1)")
    p.add_argument("--output-format", default="text", choices=["text", "jsonl"],
                   help="jsonl: one JSON object per input line: the translation, its score and log-probability, "
                        "its pieces and their log-probabilities (and the n-best) (default: text)")
    p.add_argument("--prefix-file", default=None,
                   help="a file aligned with the input: each translation begins with its line (empty: no "
                        "prefix), the rest is searched")
    _add_decode_options(p, constraints=True)
    _add_runtime_options(p)
    p.set_defaults(func=_cmd_translate)


def _cmd_translate(args: argparse.Namespace) -> int:
    from .inference import draft_summary, translate_file
    with _load(args) as translator:
        translate_file(translator, args.input, args.output, prefix_path=args.prefix_file, terms=terms_of(args),
                       output_format=args.output_format, **decode_overrides(args))
        draft = draft_summary(translator)
    if draft is not None:
        print(f"draft: {draft['acceptance']:.1%} of proposed tokens accepted, {draft['tokens_per_model_step']:.2f} "
              "tokens per step of the model", file=sys.stderr)
    return 0


def _add_score(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("score", help="score given translations (forced decoding): per line the log-probability "
                                     "and the score beam search would give that output")
    p.add_argument("model_dir", help="model directory")
    p.add_argument("ensemble", nargs="*", metavar="MORE_MODEL_DIRS", help="more model directories: score with "
                   "their ensemble")
    p.add_argument("--src", required=True, help="source file, one sentence per line")
    p.add_argument("--tgt", required=True, help="target file aligned with --src (an empty line: the empty "
                   "translation, scored as EOS alone)")
    p.add_argument("--output", default=None, help="output file (default: stdout)")
    p.add_argument("--output-format", default="text", choices=["text", "jsonl"],
                   help="text: 'LOG_PROB<TAB>SCORE' per line; jsonl: also the target pieces and their "
                        "log-probabilities (default: text)")
    _add_decode_options(p)
    _add_runtime_options(p, workers=False)
    p.set_defaults(func=_cmd_score)


def _cmd_score(args: argparse.Namespace) -> int:
    from .inference import load
    from .inference.files import score_files
    with load([args.model_dir, *args.ensemble], runtime_of(args)) as translator:
        score_files(translator, args.src, args.tgt, args.output, args.output_format,
                    translator.settings(**decode_overrides(args)))
    return 0


def _add_generate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="continue prompts with a decoder-only language model")
    p.add_argument("model_dir", help="model directory of a decoder_only model")
    p.add_argument("--prompt", action="append", default=None,
                   help="a prompt (repeatable; may be empty); without it, one prompt per line of --input")
    p.add_argument("--input", default=None, help="prompts file, one per line (default: stdin)")
    p.add_argument("--output", default=None, help="output file, written atomically (default: stdout)")
    p.add_argument("--max-new-tokens", type=int, default=50, help="tokens to add at most (default: 50)")
    p.add_argument("--min-new-tokens", type=int, default=0, help="tokens to add before EOS may end one (default: 0)")
    p.add_argument("--temperature", type=float, default=1.0, help="0 = greedy (default: 1.0)")
    p.add_argument("--top-k", type=int, default=0, help="sample among the k most probable tokens (0 = off)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1.0 = off)")
    p.add_argument("--seed", type=int, default=None, help="seed for reproducible samples")
    p.add_argument("--batch-size", type=int, default=32, help="prompts per batch (default: 32)")
    _add_runtime_options(p, workers=False)
    p.set_defaults(func=_cmd_generate)


def _cmd_generate(args: argparse.Namespace) -> int:
    from .inference import GenerationConfig, Generator
    from .inference.files import atomic_output, iter_lines, one_line
    gen = GenerationConfig(args.max_new_tokens, args.temperature, args.top_k, args.top_p, args.seed, args.batch_size,
                           args.min_new_tokens)
    with Generator.load(args.model_dir, runtime_of(args)) as generator:
        prompts = args.prompt if args.prompt is not None else list(iter_lines(args.input))
        texts = generator.generate(prompts, gen)
    with atomic_output(args.output) as out:
        for text in texts:
            out.write(one_line(text) + "\n")
    return 0


def _add_classify(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("classify", help="label text with a classifier; with --score, print accuracy and macro-F1")
    p.add_argument("model_dir", help="model directory of a classifier (train.task classify)")
    p.add_argument("--input", default=None,
                   help="one text (or text_a<TAB>text_b, a sentence pair) a line (default: stdin); with --score, "
                        "a file of text<TAB>label (or text_a<TAB>text_b<TAB>label) lines")
    p.add_argument("--output", default=None, help="output file for the labels, written atomically (default: stdout)")
    p.add_argument("--score", action="store_true",
                   help="score the model on --input's labels: accuracy, macro-F1 and count as JSON")
    p.add_argument("--batch-size", type=int, default=64, help="texts per batch (default: 64)")
    _add_runtime_options(p, workers=False)
    p.set_defaults(func=_cmd_classify)


def _cmd_classify(args: argparse.Namespace) -> int:
    import json

    from .inference import Classifier
    from .inference.files import atomic_output, read_texts
    if args.score and args.input is None:
        raise ConfigError("--score: needs --input, a file of text<TAB>label (or text_a<TAB>text_b<TAB>label) lines")
    with Classifier.load(args.model_dir, runtime_of(args)) as classifier:
        if args.score:
            from .evaluation.heldout import score_labelled
            print(json.dumps(score_labelled(classifier, args.input, args.batch_size), indent=2))
            return 0
        labels = classifier.classify(read_texts(args.input), args.batch_size)
    with atomic_output(args.output) as out:
        out.write("".join(f"{label}\n" for label in labels))
    return 0


def _add_evaluate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("evaluate", help="score a model on a test set and print JSON: a translation model's BLEU/chrF, "
                       "a language model's perplexity, a masked LM's masked-token perplexity, a classifier's accuracy")
    _add_model_dirs(p, "model directory; what it is scored on follows from its task")
    p.add_argument("--src", default=None, help="translation: source file, one sentence per line")
    p.add_argument("--ref", required=True,
                   help="translation: reference file, aligned with --src; lm and mlm: the text to score, one "
                        "sentence per line (no --src); classify: a file of text<TAB>label lines (no --src)")
    p.add_argument("--tok-ref", default=None,
                   help="lowercased Moses-tokenized references (e.g. Multi30k's *.lc.norm.tok.*): adds the "
                        "published-style tokenized BLEU 'bleu_moses_lc' (needs the moses extra)")
    p.add_argument("--lang", default=None, help="target language for --tok-ref (Moses rules), e.g. de")
    p.add_argument("--hyp-tokenized", action="store_true",
                   help="with --tok-ref: the model writes lowercased Moses-tokenized text (trained with "
                        "data.corpus=multi30k_tok); score it as it is")
    p.add_argument("--seed", type=int, default=None,
                   help="mlm: seeds which tokens are masked, per line (default: a default run's train.seed, "
                        "as its validation)")
    _add_decode_options(p)
    _add_runtime_options(p)
    p.set_defaults(func=_cmd_evaluate)


def _cmd_evaluate(args: argparse.Namespace) -> int:
    import json

    from .evaluation import EvalFiles, evaluate_model
    if args.worker_timeout is not None and not args.workers:
        raise ConfigError("--worker-timeout: is for --workers")
    files = EvalFiles(args.ref, args.src, args.tok_ref, args.lang, args.hyp_tokenized)
    result = evaluate_model([args.model_dir, *args.ensemble], files, runtime_of(args), decode_overrides(args),
                            args.draft, args.seed)
    print(json.dumps(result, indent=2, ensure_ascii=False))
    return 0


def _add_attention(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("attention", help="plot encoder, decoder and cross-attention of one sentence")
    p.add_argument("model_dir", help="model directory")
    p.add_argument("sentence", help="the source sentence")
    p.add_argument("--out", required=True, help="PNG file to write")
    p.add_argument("--layer", type=int, default=-1, help="layer index, negative from the top (default: -1)")
    p.add_argument("--head", type=int, default=None, help="head index (default: mean over heads)")
    p.add_argument("--beam", type=int, default=None, help="beam size for the translation (default: the model's)")
    _add_runtime_options(p, workers=False)
    p.set_defaults(func=_cmd_attention)


def _cmd_attention(args: argparse.Namespace) -> int:
    from .inference import Translator, attention_maps
    from .viz.attention import plot_attention
    with Translator.load(args.model_dir, runtime_of(args)) as translator:
        maps = attention_maps(translator, args.sentence, args.layer, args.head, **decode_overrides(args))
    print(plot_attention(maps, args.out))
    return 0


def _add_export(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="export a model to Hugging Face (Marian; GPT-2 for a language model), "
                       "CTranslate2 or ONNX (verified)")
    p.add_argument("model_dir", help="model directory (config.yaml, model.safetensors, tokenizer)")
    p.add_argument("--format", required=True, choices=["hf", "ctranslate2", "onnx"], help="target format")
    p.add_argument("--out", required=True, help="directory to write (written atomically)")
    p.add_argument("--quantization", default=None, choices=["int8"], help="int8 weights (ctranslate2 only)")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    p.set_defaults(func=_cmd_export)


def _cmd_export(args: argparse.Namespace) -> int:
    from .export import export_model
    report = export_model(args.model_dir, args.format, args.out, args.quantization, args.force)
    print(report.summary())
    return 0


def _add_info(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("info", help="what a model is: arch, shape, parameters, tokenizer, decoding and "
                       "training settings, last metrics")
    p.add_argument("model_dir", help="model directory (e.g. RUN/model or RUN/checkpoints/step_N)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(func=_cmd_info)


def _cmd_info(args: argparse.Namespace) -> int:
    import json

    from .info import format_info, model_info
    info = model_info(args.model_dir)
    print(json.dumps(info, indent=2, ensure_ascii=False) if args.json else format_info(info))
    return 0


def _add_rehash(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("rehash", help="accept an intentional edit of a model directory's config.yaml: record its "
                       "new sha256 (loading checks it)")
    p.add_argument("model_dir", help="model or checkpoint directory whose config.yaml you edited")
    p.set_defaults(func=_cmd_rehash)


def _cmd_rehash(args: argparse.Namespace) -> int:
    from .checksums import EDITABLE, record
    from .model.io import load_decode_config, load_model_config
    directory = Path(args.model_dir)
    if not (directory / EDITABLE).is_file():
        raise ConfigError(f"{directory}: no {EDITABLE} here (give a model or checkpoint directory)")
    record(directory, [EDITABLE])
    load_model_config(directory)  # the edit must still be a valid config
    load_decode_config(directory)
    print(f"recorded the sha256 of {directory / EDITABLE}")
    return 0


def _add_import(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("import", help="import a Hugging Face MarianMTModel directory (e.g. OPUS-MT) as a "
                       "transduce model (verified)")
    p.add_argument("marian_dir", help="local MarianMTModel directory: config.json, model.safetensors (or "
                   "pytorch_model.bin), source.spm, target.spm, vocab.json")
    p.add_argument("--out", required=True, help="model directory to write (written atomically)")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    p.set_defaults(func=_cmd_import)


def _cmd_import(args: argparse.Namespace) -> int:
    import json

    from .export.hf_import import import_hf
    checks = import_hf(args.marian_dir, args.out, args.force)
    print(json.dumps({"out": args.out, **checks}, indent=2))
    return 0


def _add_serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="HTTP translation server with dynamic batching and a demo page")
    _add_model_dirs(p, "model directory (config.yaml, model.safetensors, tokenizer)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, loopback only)")
    p.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    p.add_argument("--batch-wait-ms", type=float, default=5.0,
                   help="how long to gather concurrent requests into one batch (default: 5)")
    p.add_argument("--no-batching", action="store_true", help="run each request on its own")
    p.add_argument("--api-key-file", default=None,
                   help="a file holding the API key that POST requests must send as 'Authorization: Bearer KEY' "
                        "(default: $TRANSDUCE_API_KEY if set, else no key)")
    p.add_argument("--max-per-client", type=int, default=None,
                   help="requests one client address may have in flight; more are answered 429 (default: no limit)")
    _add_decode_options(p)
    _add_runtime_options(p)
    p.set_defaults(func=_cmd_serve)


def _api_key(path: str | None) -> str | None:
    """The key of --api-key-file, else of $TRANSDUCE_API_KEY, else None."""
    import os

    if path is None:
        return os.environ.get("TRANSDUCE_API_KEY") or None
    try:
        key = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"--api-key-file: cannot read {path} ({e.__class__.__name__})") from None
    if not key:
        raise ConfigError(f"--api-key-file: {path} is empty")
    return key


def _cmd_serve(args: argparse.Namespace) -> int:
    from .serve import ServeConfig, serve
    if args.worker_timeout is not None and not args.workers:
        raise ConfigError("--worker-timeout: is for --workers")
    cfg = ServeConfig(host=args.host, port=args.port, batch_wait_ms=args.batch_wait_ms, batching=not args.no_batching,
                      api_key=_api_key(args.api_key_file), max_per_client=args.max_per_client)
    serve([args.model_dir, *args.ensemble], cfg, runtime_of(args), args.draft, decode_overrides(args))
    return 0


def _add_data(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("data", help="fetch a public corpus")
    corpora = p.add_subparsers(dest="corpus", required=True, metavar="CORPUS")
    m = corpora.add_parser("multi30k", help="Multi30k task 1 (en, de, fr, cs), checksum-verified")
    m.add_argument("--dest", required=True, help="directory for the .gz files")
    m.add_argument("--url", default=None, help="base URL (default: the dataset's GitHub repository)")
    m.set_defaults(func=_cmd_data_multi30k)


def _cmd_data_multi30k(args: argparse.Namespace) -> int:
    from .data import multi30k
    paths = multi30k.download(args.dest, base_url=args.url or multi30k.DEFAULT_URL)
    print(f"{len(paths)} files verified in {args.dest}; use them with: --set data.corpus=multi30k "
          f"--set data.root={args.dest}  (or export TRANSDUCE_MULTI30K={args.dest})")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="transduce", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"transduce {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("-q", "--quiet", action="store_true", help="warnings and errors only, no progress bars")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_prepare(sub)
    _add_train(sub)
    _add_demo(sub)
    _add_average(sub)
    _add_plot(sub)
    _add_data(sub)
    _add_translate(sub)
    _add_score(sub)
    _add_generate(sub)
    _add_classify(sub)
    _add_evaluate(sub)
    _add_attention(sub)
    _add_export(sub)
    _add_import(sub)
    _add_info(sub)
    _add_rehash(sub)
    _add_serve(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING if args.quiet else logging.INFO,
                        format="%(message)s", stream=sys.stderr)
    progress.QUIET = args.quiet
    try:
        return int(args.func(args) or 0)
    except TransduceError as e:
        print(f"transduce {args.command}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        print(f"transduce {args.command}: error: {e.strerror}{f': {e.filename}' if e.filename else ''} "
              "(nothing half-written was kept; free space and rerun, with --resume for training)", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"transduce {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
