"""Command-line interface: parses arguments and calls the library; nothing else."""

from __future__ import annotations

import argparse
import errno
import logging
import os
import re
import sys

from .. import __version__, progress
from ..errors import TransduceError
from . import cleaning, decoding, models, serving, speed, training


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="transduce", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"transduce {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("-q", "--quiet", action="store_true", help="warnings and errors only, no progress bars")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    training.add_commands(sub)
    cleaning.add_commands(sub)
    decoding.add_commands(sub)
    models.add_commands(sub)
    serving.add_commands(sub)
    speed.add_commands(sub)
    return parser


# Library errors name settings; where the command line sets one with a flag of its own, the
# message the CLI prints names the flag the user typed instead.
SETTING_FLAGS = {"export.format": "--format", "export.quantization": "--quantization",
                 "export.precision": "--precision", "export.max_batch": "--max-batch", "export.name": "--name",
                 "force=True": "--force", "resume=True": "--resume", "quantize.calibration": "--calibrate",
                 "serve.batching": "--batching"}
_SETTING = re.compile("|".join(rf"(?<![\w.]){re.escape(key)}(?![\w])" for key in SETTING_FLAGS))


def flag_names(message: str) -> str:
    """``message`` with each setting in :data:`SETTING_FLAGS` written as its command-line flag."""
    return _SETTING.sub(lambda m: SETTING_FLAGS[m.group(0)], message)


# Storage faults a user fixes outside transduce, and what to do: one line each, no traceback.
_STORAGE_ERRORS = {errno.ENOSPC: "free space", errno.EDQUOT: "free space",
                   errno.EROFS: "write somewhere writable", errno.EACCES: "fix the permissions"}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING if args.quiet else logging.INFO,
                        format="%(message)s", stream=sys.stderr)
    progress.QUIET = args.quiet
    try:
        status = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe (`transduce info --json | head`) shows here, not at exit
        return status
    except BrokenPipeError:
        # The reader went away: stop quietly, as `cat` does; stdout goes to /dev/null so Python's
        # own flush at exit does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a command killed by a closed pipe
    except TransduceError as e:
        print(f"transduce {args.command}: error: {flag_names(str(e))}", file=sys.stderr)
        return 2
    except OSError as e:
        if e.errno not in _STORAGE_ERRORS:
            raise
        print(f"transduce {args.command}: error: {e.strerror}{f': {e.filename}' if e.filename else ''} "
              f"(nothing half-written was kept; {_STORAGE_ERRORS[e.errno]} and rerun, with --resume for training)",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"transduce {args.command}: interrupted", file=sys.stderr)
        return 130

