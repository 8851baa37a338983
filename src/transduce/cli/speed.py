"""Commands about speed: profile (where the time goes), shortlist (a smaller output layer),
quantize (static int8)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..config import QuantizeConfig
from ..errors import ConfigError


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Adds this module's commands, in the order ``--help`` lists them."""
    _add_profile(sub)
    _add_shortlist(sub)
    _add_quantize(sub)


def _add_profile(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("profile", help="run a few training steps (given a config) or decoding batches (given a "
                       "model directory) under torch.profiler: a Chrome/Perfetto and a TensorBoard trace, the top "
                       "operators and the time split (attention, FFN, softmax/loss, data, optimizer)")
    p.add_argument("target", metavar="MODEL_DIR_OR_CONFIG",
                   help="a run config (YAML): profile training; a model directory: profile decoding")
    p.add_argument("--out", required=True, help="directory for trace.json and tensorboard/")
    p.add_argument("--steps", type=int, default=5,
                   help="training steps or decoding batches profiled, after one warm-up (default: 5)")
    p.add_argument("--input", default=None, help="decoding: source sentences, one per line (required)")
    p.add_argument("--batch-size", type=int, default=16, help="decoding: sentences per batch (default: 16)")
    p.add_argument("--beam", type=int, default=None,
                   help="decoding: beam size (1 = greedy; default: the model's decode settings)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="training: override a config value (repeatable)")
    p.add_argument("--rows", type=int, default=15, help="rows of the top operators table (default: 15)")
    p.set_defaults(func=_cmd_profile)


def _cmd_profile(args: argparse.Namespace) -> int:
    from ..profiling import profile_decoding, profile_training  # lazy: start-up
    target = Path(args.target)
    for name, value in (("--steps", args.steps), ("--batch-size", args.batch_size), ("--rows", args.rows)):
        if value < 1:
            raise ConfigError(f"{name}: must be >= 1; got {value}")
    if target.is_dir():
        if args.input is None:
            raise ConfigError(f"--input: profiling {target}'s decoding needs source sentences (a file, one a line)")
        if args.overrides:
            raise ConfigError("--set: overrides a training config; a model directory decodes (use --beam)")
        overrides = {} if args.beam is None else {"beam": args.beam}
        profile = profile_decoding(str(target), args.input, args.steps, args.batch_size, Path(args.out), overrides,
                                   args.rows)
    elif target.is_file():
        if args.input is not None or args.beam is not None:
            raise ConfigError("--input/--beam: profile decoding, given a model directory, not a config")
        profile = profile_training(str(target), args.overrides, args.steps, Path(args.out), args.rows)
    else:
        raise ConfigError(f"MODEL_DIR_OR_CONFIG: {target} is neither a model directory nor a config file")
    print(profile.report())
    return 0


def _add_shortlist(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("shortlist", help="build a model directory's vocabulary shortlist from parallel text: for each "
                       "source token the target tokens it co-occurs with most, and the most frequent target tokens "
                       "(decode with --shortlist)")
    p.add_argument("model_dir", help="model directory; shortlist.safetensors is written into it (atomically)")
    p.add_argument("--src", required=True, help="source side of the training text, one sentence per line")
    p.add_argument("--tgt", required=True, help="target side, aligned with --src")
    p.add_argument("--k", type=int, default=20, help="target tokens kept per source token (default: 20)")
    p.add_argument("--frequent", type=int, default=100,
                   help="most frequent target tokens always kept (default: 100)")
    p.set_defaults(func=_cmd_shortlist)


def _cmd_shortlist(args: argparse.Namespace) -> int:
    from ..inference.search.shortlist import FILE, shortlist_corpus  # lazy: start-up
    shortlist = shortlist_corpus(args.model_dir, args.src, args.tgt, args.k, args.frequent)
    listed = int((shortlist.table >= 0).any(dim=1).sum())
    print(f"wrote {Path(args.model_dir) / FILE}: up to {args.k} target tokens for each of {listed} source tokens, "
          f"{len(shortlist.frequent)} frequent ones; decode with --shortlist")
    return 0


def _add_quantize(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("quantize", help="static int8 of a translation model's linear layers (torchao), calibrated "
                       "on a sample of source text (or a train.qat model's own scales): a model directory that "
                       "translate, evaluate and serve load")
    p.add_argument("model_dir", help="the float model directory (a trained or QAT-trained model)")
    p.add_argument("--calibrate", default=None, metavar="FILE",
                   help="source sentences, one per line (a few hundred like the text to translate); needed unless "
                   "the model was trained with train.qat, whose scales are used without it")
    p.add_argument("--out", required=True, help="the static int8 model directory to write (atomically)")
    p.add_argument("--float-layers", nargs="*", default=None, metavar="PATTERN",
                   help="linear layers kept in float32, names or fnmatch patterns (quantize.float_layers; "
                   "default: output_proj, the vocabulary projection; given with no pattern: none)")
    p.set_defaults(func=_cmd_quantize)


def _cmd_quantize(args: argparse.Namespace) -> int:
    from ..inference.quantize import quantize_directory  # lazy: start-up
    from ..inference.speed.static_int8 import FILE, read_float_layers  # lazy: start-up
    config = QuantizeConfig() if args.float_layers is None else QuantizeConfig(float_layers=tuple(args.float_layers))
    absmax = quantize_directory(args.model_dir, args.calibrate, args.out, config)
    kept = read_float_layers(args.out)
    print(f"wrote {args.out}: {len(absmax) - len(kept)} linear layers in static int8 ({FILE}), "
          f"{len(kept)} in float32; translate it like any model")
    return 0
