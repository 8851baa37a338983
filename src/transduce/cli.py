"""Command-line interface: parses arguments and calls the library; nothing else.

User errors (:class:`~transduce.errors.TransduceError`) are printed as one line on stderr and
exit with status 2.
"""

from __future__ import annotations

import argparse
import logging
import sys

from . import __version__
from .errors import TransduceError


def _add_train(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a model from a YAML config")
    p.add_argument("config", nargs="?", help="run config (YAML); defaults if omitted")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a config value (repeatable)")
    p.add_argument("--out", default=None, help="run directory (default: runs/<name>)")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --out")
    p.set_defaults(func=_cmd_train)


def _cmd_train(args: argparse.Namespace) -> int:
    from .training.loop import train_main
    return train_main(args.config, args.overrides, args.out, args.resume)


def _add_demo(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="train and evaluate on the embedded toy language pair (no download)")
    p.add_argument("--out", default="runs/demo", help="run directory (default: runs/demo)")
    p.add_argument("--steps", type=int, default=None, help="training steps (default: the demo's own)")
    p.set_defaults(func=_cmd_demo)


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo
    result = run_demo(args.out, steps=args.steps)
    print(result.report())
    return 0


def _add_average(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("average", help="average the weights of checkpoints (Sec. 6.1)")
    p.add_argument("checkpoints", nargs="+", help="checkpoint or model directories of one config")
    p.add_argument("--out", required=True, help="model directory to write")
    p.set_defaults(func=_cmd_average)


def _cmd_average(args: argparse.Namespace) -> int:
    from pathlib import Path

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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="transduce", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"transduce {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_train(sub)
    _add_demo(sub)
    _add_average(sub)
    _add_plot(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(message)s", stream=sys.stderr)
    try:
        return int(args.func(args) or 0)
    except TransduceError as e:
        print(f"transduce {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"transduce {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
