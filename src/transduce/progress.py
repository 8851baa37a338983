"""Progress bars on long work: tqdm's, on standard error, only where someone watches them.

Training (steps, with loss, lr and tokens/s), ``translate``/``evaluate`` over a file (sentences),
``prepare`` (sentences encoded), downloads (bytes) and export verification (checks) open one with
:func:`progress_bar`. A bar is drawn when standard error is a terminal, never with ``transduce
--quiet``; ``TRANSDUCE_PROGRESS=1`` draws it anyway (a log collector that wants it, a test) and
``TRANSDUCE_PROGRESS=0`` never. Standard output is never written: it carries translations.
While a bar is drawn, log lines go above it (``tqdm.write``) instead of through it.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:  # imported where a bar is opened: tqdm and its logging helper cost 70 ms at start-up
    from tqdm import tqdm

# Set by ``transduce --quiet``: no bars at all.
QUIET = False
# "1": draw bars even when standard error is not a terminal; "0": never draw them.
FORCE_ENV = "TRANSDUCE_PROGRESS"


def bars_shown() -> bool:
    """Whether a bar opened now is drawn: not quiet, and a terminal (or TRANSDUCE_PROGRESS=1)."""
    forced = os.environ.get(FORCE_ENV, "").strip()
    if QUIET or forced == "0":
        return False
    return forced == "1" or (hasattr(sys.stderr, "isatty") and sys.stderr.isatty())


@contextlib.contextmanager
def progress_bar(total: int | None, unit: str, desc: str | None = None, initial: int = 0,
                 enabled: bool = True, bytes_: bool = False) -> Iterator[tqdm]:
    """A tqdm bar on standard error for the block (count, rate, ETA when ``total`` is known).

    Args:
        total: the count at which the work is done (None: unknown, no ETA).
        unit: what is counted, plural ("steps", "sentences"; "B" for bytes).
        desc: a short label before the bar.
        initial: the count already done (a resumed run): the rate and ETA count from here.
        enabled: False draws nothing (e.g. ranks other than the first).
        bytes_: show the count as KiB/MiB (``unit`` "B").

    A bar that is not drawn is tqdm's disabled bar: ``update`` and ``set_postfix`` do nothing.
    """
    from tqdm import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    sized = _sized()
    bar = tqdm(total=total, initial=initial, unit=unit if bytes_ else f" {unit}", desc=desc,
               disable=not (enabled and bars_shown()), file=sys.stderr, mininterval=0.2,
               dynamic_ncols=sized, nrows=None if sized else 24,
               unit_scale=bytes_, unit_divisor=1024 if bytes_ else 1000)
    try:
        if bar.disable:
            yield bar
        else:
            with logging_redirect_tqdm():
                yield bar
    finally:
        bar.close()


def _sized() -> bool:
    """Whether standard error is a terminal that knows its size: the bar then follows its width.
    Otherwise (a pipe; a pseudo-terminal of size 0x0, where tqdm would take -1 rows and draw
    nothing) the bar is drawn at tqdm's default width, assuming 24 rows."""
    try:
        return min(os.get_terminal_size(sys.stderr.fileno())) > 0
    except (AttributeError, ValueError, OSError, io.UnsupportedOperation):
        return False
