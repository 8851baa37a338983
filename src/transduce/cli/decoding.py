"""Commands that run a model on text: translate, generate, classify, evaluate, attention."""

from __future__ import annotations

import argparse
import sys

from ..errors import ConfigError
from .options import (add_constraint_options, add_decode_options, add_model_dirs, add_runtime_options,
                      check_worker_timeout, decode_overrides, load_translator, runtime_of, terms_of)


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Adds this module's commands, in the order ``--help`` lists them."""
    _add_translate(sub)
    _add_score(sub)
    _add_generate(sub)
    _add_classify(sub)
    _add_evaluate(sub)
    _add_attention(sub)


def _add_translate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("translate", help="translate lines of text (stdin to stdout by default)")
    add_model_dirs(p, "model directory (config.yaml, model.safetensors, tokenizer)")
    p.add_argument("--input", default=None, help="input file, one sentence per line (default: stdin)")
    p.add_argument("--output", default=None, help="output file, written atomically (default: stdout)")
    p.add_argument("--nbest", type=int, default=None,
                   help="K > 1 writes K lines 'SCORE<TAB>TEXT' per input line, best first (default: 1)")
    p.add_argument("--output-format", default="text", choices=["text", "jsonl"],
                   help="jsonl: one JSON object per input line: the translation, its score and log-probability, "
                        "its pieces and their log-probabilities, its word alignment (and the n-best) (default: text)")
    p.add_argument("--markup", action="store_true",
                   help="keep tags, {placeholders} and URLs: taken out before translation, put back at aligned "
                        "positions (see --alignment-layer)")
    p.add_argument("--prefix-file", default=None,
                   help="a file aligned with the input: each translation begins with its line (empty: no "
                        "prefix), the rest is searched")
    p.add_argument("--documents", action="store_true",
                   help="the input is a document: paragraphs separated by blank lines, split into sentences "
                        "(the documents extra), translated in one batch and put back together; nothing is cut")
    p.add_argument("--language", default="en", help="with --documents: the source language's ISO 639 code, for "
                   "the sentence splitter (default: en)")
    add_decode_options(p)
    add_constraint_options(p)
    add_runtime_options(p)
    p.set_defaults(func=_cmd_translate)


def _cmd_translate(args: argparse.Namespace) -> int:
    from ..inference import draft_summary, translate_file  # lazy: start-up
    if args.documents:
        return _cmd_translate_documents(args)
    with load_translator(args) as translator:
        translate_file(translator, args.input, args.output, prefix_path=args.prefix_file, terms=terms_of(args),
                       output_format=args.output_format, markup=args.markup, **decode_overrides(args))
        draft = draft_summary(translator)
    if draft is not None:
        print(f"draft: {draft['acceptance']:.1%} of proposed tokens accepted, {draft['tokens_per_model_step']:.2f} "
              "tokens per step of the model", file=sys.stderr)
    return 0


def _cmd_translate_documents(args: argparse.Namespace) -> int:
    from ..inference.documents import translate_document_file  # lazy: start-up
    given = [flag for flag, value in (("--nbest", (args.nbest or 1) > 1), ("--prefix-file", args.prefix_file),
                                      ("--output-format jsonl", args.output_format != "text"),
                                      ("--constraints", args.constraints), ("--glossary", args.glossary)) if value]
    if given:
        raise ConfigError(f"translate --documents: writes one translated document; drop {', '.join(given)}")
    with load_translator(args) as translator:
        translate_document_file(translator, args.input, args.output, args.language, markup=args.markup,
                                **decode_overrides(args))
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
    add_decode_options(p)
    add_runtime_options(p, workers=False)
    p.set_defaults(func=_cmd_score)


def _cmd_score(args: argparse.Namespace) -> int:
    from ..inference import load  # lazy: start-up
    from ..inference.files import score_files  # lazy: start-up
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
    add_runtime_options(p, workers=False)
    p.set_defaults(func=_cmd_generate)


def _cmd_generate(args: argparse.Namespace) -> int:
    from ..inference import GenerationConfig, Generator  # lazy: start-up
    from ..inference.files import atomic_output, iter_lines, one_line  # lazy: start-up
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
    add_runtime_options(p, workers=False)
    p.set_defaults(func=_cmd_classify)


def _cmd_classify(args: argparse.Namespace) -> int:
    import json

    from ..inference import Classifier  # lazy: start-up
    from ..inference.files import atomic_output, read_texts  # lazy: start-up
    if args.score and args.input is None:
        raise ConfigError("--score: needs --input, a file of text<TAB>label (or text_a<TAB>text_b<TAB>label) lines")
    with Classifier.load(args.model_dir, runtime_of(args)) as classifier:
        if args.score:
            from ..evaluation.heldout import score_labelled  # lazy: start-up
            print(json.dumps(score_labelled(classifier, args.input, args.batch_size), indent=2))
            return 0
        labels = classifier.classify(read_texts(args.input), args.batch_size)
    with atomic_output(args.output) as out:
        out.write("".join(f"{label}\n" for label in labels))
    return 0


def _add_evaluate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("evaluate", help="score a model on a test set and print JSON: a translation model's BLEU/chrF, "
                       "a language model's perplexity, a masked LM's masked-token perplexity, a classifier's accuracy")
    add_model_dirs(p, "model directory; what it is scored on follows from its task")
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
    p.add_argument("--compare", default=None, metavar="OTHER_HYP_OR_MODEL",
                   help="translation: test the model against another system, its translations of --src (a file) "
                        "or a model directory (translated with the same settings): paired bootstrap and approximate "
                        "randomization p-values and 95%% confidence intervals of BLEU and chrF (sacrebleu's)")
    p.add_argument("--seed", type=int, default=None,
                   help="mlm: seeds which tokens are masked, per line (default: a default run's train.seed, "
                        "as its validation)")
    p.add_argument("--nbest", type=int, default=None,
                   help="translation, with --rerank: the K best of the beam that reranking chooses among "
                        "(default: the model's decode.nbest); without --rerank the best is scored")
    add_decode_options(p)
    add_runtime_options(p)
    p.set_defaults(func=_cmd_evaluate)


def _cmd_evaluate(args: argparse.Namespace) -> int:
    import json

    from ..evaluation import EvalFiles, evaluate_model  # lazy: start-up
    check_worker_timeout(args)
    files = EvalFiles(args.ref, args.src, args.tok_ref, args.lang, args.hyp_tokenized, args.compare)
    result = evaluate_model([args.model_dir, *args.ensemble], files, runtime_of(args), decode_overrides(args),
                            args.draft, args.seed)
    print(json.dumps(result, indent=2, ensure_ascii=False))
    return 0


def _add_attention(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("attention", help="plot encoder, decoder and cross-attention of one sentence; with --stats, "
                       "the health of every head over a file (entropy, collapse onto BOS/EOS/offsets, word order)")
    p.add_argument("model_dir", help="model directory")
    p.add_argument("sentence", nargs="?", default=None, help="the source sentence (not with --stats)")
    p.add_argument("--out", default=None, help="PNG file to write (the heatmaps; not with --stats)")
    p.add_argument("--layer", type=int, default=-1, help="layer index, negative from the top (default: -1)")
    p.add_argument("--head", type=int, default=None, help="head index (default: mean over heads)")
    p.add_argument("--beam", type=int, default=None, help="beam size for the translation (default: the model's)")
    s = p.add_argument_group("attention health (--stats)")
    s.add_argument("--stats", action="store_true", help="per layer, head and kind: normalised entropy, mean maximum "
                   "weight, where the argmax lands; flags near-uniform and collapsed heads; prints a table")
    s.add_argument("--src", default=None, help="with --stats: source file, one sentence per line")
    s.add_argument("--tgt", default=None, help="with --stats: targets aligned with --src, force-decoded instead of "
                   "the model's translations")
    s.add_argument("--align", default=None, help="with --stats and --tgt: reference word alignments (Pharaoh i-j, "
                   "a line per pair): each cross-attention head's alignment error rate")
    s.add_argument("--json", action="store_true", help="with --stats: print JSON instead of the table")
    s.add_argument("--plot", default=None, metavar="PNG", help="with --stats: also draw the grid of heads")
    s.add_argument("--uniform", type=float, default=0.95,
                   help="a query is near-uniform at this normalised entropy or more (default: 0.95)")
    s.add_argument("--collapse", type=float, default=0.5,
                   help="a query collapses with this much weight on one position class (default: 0.5)")
    s.add_argument("--share", type=float, default=0.9,
                   help="a head is flagged when this share of its queries is near-uniform or collapses onto one "
                        "class (default: 0.9)")
    add_runtime_options(p, workers=False)
    p.set_defaults(func=_cmd_attention)


def _cmd_attention(args: argparse.Namespace) -> int:
    from ..inference import Translator, attention_maps  # lazy: start-up
    if args.stats:
        return _attention_stats(args)
    extra = [flag for flag in ("src", "tgt", "align", "plot") if getattr(args, flag) is not None] + ["json"] * args.json
    if extra:
        raise ConfigError(f"--{extra[0]}: is for --stats")
    if args.sentence is None or args.out is None:
        raise ConfigError("attention: give a SENTENCE and --out PNG (or --stats --src FILE)")
    from ..viz.attention_heatmaps import plot_attention  # lazy: start-up
    with Translator.load(args.model_dir, runtime_of(args)) as translator:
        maps = attention_maps(translator, args.sentence, args.layer, args.head, **decode_overrides(args))
    print(plot_attention(maps, args.out))
    return 0


def _attention_stats(args: argparse.Namespace) -> int:
    import json

    from ..inference import HealthLimits, Translator, attention_stats_files, format_attention_stats  # lazy: start-up
    if args.sentence is not None or args.out is not None:
        raise ConfigError("--stats: reads its sentences from --src and draws with --plot (no SENTENCE, no --out)")
    if args.src is None:
        raise ConfigError("--stats: needs --src FILE, the sentences to measure")
    limits = HealthLimits(args.uniform, args.collapse, args.share)
    if args.plot is not None:
        from ..viz.curves import require_matplotlib  # lazy: start-up
        require_matplotlib("attention plots")  # before the model runs
    with Translator.load(args.model_dir, runtime_of(args)) as translator:
        stats = attention_stats_files(translator, args.src, args.tgt, args.align, limits, **decode_overrides(args))
    print(json.dumps(stats.to_dict(), indent=2) if args.json else format_attention_stats(stats))
    if args.plot is not None:
        from ..viz.attention_heatmaps import plot_attention_stats  # lazy: start-up
        print(plot_attention_stats(stats, args.plot), file=sys.stderr if args.json else sys.stdout)
    return 0
