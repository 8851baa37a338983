"""The options several commands share: a run config, model directories, the runtime, decoding
settings; and turning them into the library's values (one ``load`` for the model directories)."""

from __future__ import annotations

import argparse
import logging

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


def add_decode_options(p: argparse.ArgumentParser) -> None:
    """Decoding settings; each replaces one of the model directory's saved settings (its
    config.yaml ``decode`` section), those not given keep them."""
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


# argparse dest -> DecodeConfig field, for the flags that override the saved decoding settings
DECODE_FLAGS = {"beam": "beam", "lenpen": "lenpen", "max_len_a": "max_len_a", "max_len_b": "max_len_b",
                "batch_tokens": "batch_tokens", "stop": "stop", "nbest": "nbest", "draft_tokens": "draft_tokens",
                "draft_threshold": "draft_threshold"}


def decode_overrides(args: argparse.Namespace) -> dict:
    """The decoding settings given on the command line (DecodeConfig field -> value)."""
    return {field: getattr(args, dest) for dest, field in DECODE_FLAGS.items() if getattr(args, dest, None) is not None}


def check_worker_timeout(args: argparse.Namespace) -> None:
    """--worker-timeout is a setting of the worker processes: an error without --workers."""
    if args.worker_timeout is not None and not args.workers:
        raise ConfigError("--worker-timeout: is for --workers")


def runtime_of(args: argparse.Namespace):
    """The :class:`~transduce.inference.Runtime` the command line asks for."""
    from ..inference import Runtime
    extra = {} if getattr(args, "worker_timeout", None) is None else {"worker_timeout_s": args.worker_timeout}
    return Runtime(device=args.device, precision=args.precision, int8=args.int8, workers=getattr(args, "workers", 0),
                   threads=args.threads, **extra)


def load_translator(args: argparse.Namespace):
    """The model directories of the command line, loaded for its runtime (the one front door)."""
    from ..inference import load
    check_worker_timeout(args)
    if args.draft is not None and args.beam not in (None, 1):
        raise ConfigError(f"--draft: speculative decoding is greedy; got --beam {args.beam} (use --beam 1)")
    translator = load([args.model_dir, *args.ensemble], runtime_of(args), args.draft)
    if args.draft is not None and translator.settings(**decode_overrides(args)).batch_tokens > 1:
        logging.getLogger("transduce.inference").warning(
            "--draft: a batch advances by its sentences' smallest number of accepted proposals, so speculative "
            "decoding pays one sentence at a time (--batch-tokens 1); for a file's throughput, batched greedy "
            "search without --draft is faster (BENCHMARKS.md, \"Speculative decoding\")")
    return translator

