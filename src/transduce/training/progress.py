"""Progress reporting: a one-line updating bar on a terminal, plain log lines otherwise; and the
metrics records as TensorBoard scalars (``train.tensorboard``)."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

from ..errors import require

logger = logging.getLogger("transduce.training")


class Progress:
    """Shows step, loss, lr and tokens/s. ``enabled=False`` (other ranks) shows nothing."""

    def __init__(self, total_steps: int, enabled: bool = True, stream=None):
        self.total = total_steps
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self._last = 0.0

    def update(self, step: int, fields: dict[str, float | int | str], force: bool = False) -> None:
        if not self.enabled:
            return
        text = f"step {step}/{self.total} " + " ".join(f"{k} {_fmt(v)}" for k, v in fields.items())
        if self.tty:
            now = time.monotonic()
            if force or now - self._last > 0.2:
                self.stream.write("\r\033[K" + text)
                self.stream.flush()
                self._last = now
        elif force:
            logger.info(text)

    def message(self, text: str) -> None:
        """A line that stays (clears the bar first on a terminal)."""
        if not self.enabled:
            return
        if self.tty:
            self.stream.write("\r\033[K")
        logger.info(text)

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


class TensorBoardLog:
    """Each metrics.jsonl record also as TensorBoard scalars in ``directory``: training figures
    under ``train/`` (loss, ppl, lr, tokens_per_s, grad_norm), validation ones under ``valid/``
    (``val_bleu`` becomes ``valid/bleu``), at the record's step. Needs the ``tensorboard`` extra."""

    SKIP = ("step", "epoch", "elapsed")

    def __init__(self, directory: Path):
        module = require("torch.utils.tensorboard", "tensorboard", "train.tensorboard")
        self.writer = module.SummaryWriter(str(directory))

    def write(self, record: dict) -> None:
        valid = any(k.startswith("val_") for k in record)
        for key, value in record.items():
            if key in self.SKIP or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            tag = f"valid/{key.removeprefix('val_')}" if valid else f"train/{key}"
            self.writer.add_scalar(tag, value, record["step"])
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def _fmt(v: float | int | str) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1e-2 else f"{v:.4g}" if abs(v) < 1e4 else f"{v:.0f}"
    return str(v)
