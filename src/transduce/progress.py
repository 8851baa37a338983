"""Progress on long work: a one-line updating bar on a terminal (count, rate, ETA), plain log
lines otherwise, nothing with ``transduce --quiet``.

Used by training (steps), ``translate``/``evaluate`` over a file (sentences) and ``prepare``
(sentences encoded). The bar goes to standard error and only when it is a terminal, so piped
or redirected output and log files stay as they are.
"""

from __future__ import annotations

import logging
import sys
import time

logger = logging.getLogger("transduce")

# Set by ``transduce --quiet``: no bars at all.
QUIET = False


class Progress:
    """Shows ``UNIT done/total``, the caller's ``fields``, the rate and the time left.

    Args:
        total: the count at which the work is done (None: unknown, no ETA).
        enabled: False shows nothing (e.g. ranks other than the first).
        unit: what is counted ("step", "sentences").
        stream: where the bar goes (default: standard error).
    """

    def __init__(self, total: int | None, enabled: bool = True, unit: str = "step", stream=None):
        self.total = total
        self.unit = unit
        self.enabled = enabled and not QUIET
        self.stream = stream or sys.stderr
        self.tty = self.enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.done = 0
        self._last = -float("inf")
        self._text = ""  # the bar as last computed
        self._start: tuple[float, int] | None = None  # (time, count) of the first update: resumed runs

    def update(self, done: int, fields: dict[str, float | int | str] | None = None, force: bool = False) -> None:
        """Report that ``done`` units are done; ``force`` also logs the line off a terminal."""
        self.done = done
        now = time.monotonic()
        if self._start is None:
            self._start = (now, done)
        if not self.enabled:
            return
        total = "" if self.total is None else f"/{self.total}"
        parts = [f"{self.unit} {done}{total}"] + [f"{k} {_fmt(v)}" for k, v in (fields or {}).items()]
        if self.tty:
            self._text = " ".join(parts + self._pace(now))
            if force or now - self._last > 0.2:
                self._draw()
                self._last = now
        elif force:
            logger.info(" ".join(parts))

    def advance(self, n: int = 1, fields: dict[str, float | int | str] | None = None) -> None:
        """``n`` more units done."""
        self.update(self.done + n, fields)

    def _pace(self, now: float) -> list[str]:
        """Rate and time left, from the units done since the first update."""
        t0, n0 = self._start
        elapsed, n = now - t0, self.done - n0
        if elapsed <= 0 or n <= 0:
            return []
        rate = n / elapsed
        out = [f"{_fmt(rate)} {self.unit}/s"]
        if self.total is not None and self.total > self.done:
            out.append(f"ETA {_duration((self.total - self.done) / rate)}")
        return out

    def message(self, text: str) -> None:
        """A line that stays (clears the bar first on a terminal)."""
        if not self.enabled:
            return
        if self.tty:
            self.stream.write("\r\033[K")
        logger.info(text)

    def close(self) -> None:
        """The last state (updates come at most 5 times a second), and a new line."""
        if self.tty and self._text:
            self._draw()
            self.stream.write("\n")
            self.stream.flush()
            self._text = ""

    def _draw(self) -> None:
        self.stream.write("\r\033[K" + self._text)
        self.stream.flush()


def _fmt(v: float | int | str) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1e-2 else f"{v:.4g}" if abs(v) < 1e4 else f"{v:.0f}"
    return str(v)


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"
