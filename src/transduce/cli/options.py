"""The options several commands share: a run config, model directories, the runtime, decoding
settings; and turning them into the library's values (one ``load`` for the model directories)."""

from __future__ import annotations

import argparse
import logging
from dataclasses import replace

from ..errors import ConfigError


def add_config(p: argparse.ArgumentParser, help: str) -> None:
    p.add_argument("config", nargs="?", help=help)
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a config value (repeatable)")


def add_model_dirs(p: argparse.ArgumentParser, help: str) -> None:
    """The model directory, more of them (an ensemble) and a draft model: what ``load`` takes."""
    p.add_argument("model_dir", help=help)
    p.add_argument("ensemble", nargs="*", metavar="MORE_MODEL_DIRS",
                   help="more model directories of the same tokenizer: decode with the ensemble, their "
                        "token log-probabilities averaged at every step")
    p.add_argument("--draft", default=None, metavar="DRAFT_DIR",
                   help="speculative decoding: a smaller model with the same tokenizer proposes tokens, the model "
                        "checks them in one pass; greedy (--beam 1), same output, faster")


def add_runtime_options(p: argparse.ArgumentParser, workers: bool = True) -> None:
    """Where and how the model runs (:class:`~transduce.inference.Runtime`), for every command
    that loads one."""
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default: auto)")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"],
                   help="autocast precision (default: fp32)")
    p.add_argument("--int8", action="store_true", help="dynamic int8 quantisation of the linear layers (CPU)")
    p.add_argument("--compile", action="store_true",
                   help="CPU: compile greedy search's decoding step with torch.compile (needs a C++ compiler); the "
                        "first batches compile (seconds to a minute), so it pays on long jobs and servers")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads (default: torch's choice; with --workers: per worker, default 1)")
    p.add_argument("--backend", default="torch", choices=["torch", "onnx", "tensorrt"],
                   help="what runs the encoder and decoder step: torch (default); onnx, the exported graphs in ONNX "
                        "Runtime (CPU); tensorrt, their TensorRT engines (CUDA, at the --precision they were built "
                        "for). Same searches; the graphs come from transduce export --format onnx|tensorrt (--engines)")
    p.add_argument("--engines", default=None, metavar="DIR",
                   help="with --backend onnx|tensorrt: the directory transduce export --format onnx|tensorrt wrote")
    if not workers:
        return
    p.add_argument("--workers", type=int, default=0,
                   help="decode on the CPU in N worker processes, batches spread over them (default: 0, "
                        "decode in this process; on a CPU, one worker per core is usually fastest)")
    p.add_argument("--worker-timeout", type=float, default=None, metavar="S",
                   help="with --workers: a batch not answered within S seconds (more for large batches once the "
                        "workers' speed is measured) counts as a hung worker, which is replaced and the batch "
                        "retried once (default: 120)")


def add_decode_options(p: argparse.ArgumentParser) -> None:
    """Decoding settings; each replaces one of the model directory's saved settings (its
    config.yaml ``decode`` section), those not given keep them."""
    p.add_argument("--beam", type=int, default=None, help="beam size; 1 = greedy (default: the model's, else 4)")
    p.add_argument("--tgt-lang", default=None, metavar="LANG",
                   help="a multilingual model's target language, e.g. de (its tag <2de> goes before each input); "
                        "an imported NLLB or M2M-100 model's language code, e.g. fra_Latn (its first output token)")
    p.add_argument("--src-lang", default=None, metavar="LANG",
                   help="an imported NLLB or M2M-100 model's source language code, e.g. eng_Latn (begins each input)")
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
    p.add_argument("--shortlist", action="store_const", const=True, default=None,
                   help="greedy and beam search over the model directory's vocabulary shortlist only (built by "
                        "transduce shortlist; a CPU speed-up; default: the model's decode.shortlist, off)")
    p.add_argument("--alignment-layer", type=int, default=None, metavar="L",
                   help="word alignments (jsonl output, --markup): the decoder layer whose cross-attention aligns, "
                        "negative from the top (default: -2, the penultimate)")
    p.add_argument("--alignment-head", type=int, default=None, metavar="H",
                   help="word alignments: that layer's head, e.g. the one trained with guided alignment "
                        "(default: the mean of heads)")


def add_constraint_options(p: argparse.ArgumentParser) -> None:
    """Where constraints come from: the input line, a glossary."""
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
                "reverse_weight": "reverse_weight", "mbr_samples": "mbr_samples", "shortlist": "shortlist",
                "alignment_layer": "alignment_layer", "alignment_head": "alignment_head", "tgt_lang": "tgt_lang",
                "src_lang": "src_lang"}


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
    """Where the command line's constraints come from (:class:`~transduce.inference.text.terms.Terms`)."""
    from ..inference.text.terms import Glossary, Terms  # lazy: start-up
    glossary = None if args.glossary is None else Glossary.load(args.glossary, args.glossary_ignore_case)
    return Terms(args.constraints, glossary)


def check_worker_timeout(args: argparse.Namespace) -> None:
    """--worker-timeout is a setting of the worker processes: an error without --workers."""
    if args.worker_timeout is not None and not args.workers:
        raise ConfigError("--worker-timeout: is for --workers")


def runtime_of(args: argparse.Namespace):
    """The :class:`~transduce.inference.Runtime` the command line asks for."""
    from ..inference import Runtime  # lazy: start-up
    extra = {} if getattr(args, "worker_timeout", None) is None else {"worker_timeout_s": args.worker_timeout}
    return Runtime(device=args.device, precision=args.precision, int8=args.int8, compile=args.compile,
                   workers=getattr(args, "workers", 0),
                   threads=args.threads, backend=args.backend, engines=args.engines, **extra)


def load_translator(args: argparse.Namespace):
    """The model directories of the command line, loaded for its runtime (the one front door)."""
    from ..inference import load  # lazy: start-up
    check_worker_timeout(args)
    if args.draft is not None and args.beam not in (None, 1):
        raise ConfigError(f"--draft: speculative decoding is greedy; got --beam {args.beam} (use --beam 1)")
    translator = load([args.model_dir, *args.ensemble], runtime_of(args), args.draft)
    if (getattr(args, "rerank", None) or "").startswith("reverse:"):
        plain = replace(runtime_of(args), workers=0, backend="torch", engines=None)  # the engines are the model's
        translator.reverse = load(args.rerank.split(":", 1)[1], plain)
    if args.draft is not None and translator.settings(**decode_overrides(args)).batch_tokens > 1:
        logging.getLogger("transduce.inference").warning(
            "--draft: a batch advances by its sentences' smallest number of accepted proposals, so speculative "
            "decoding pays one sentence at a time (--batch-tokens 1); for a file's throughput, batched greedy "
            "search without --draft is faster (BENCHMARKS.md, \"Speculative decoding\")")
    return translator

