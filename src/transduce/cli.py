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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="transduce", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"transduce {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_train(sub)
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
