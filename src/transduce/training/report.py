"""What a training run reports: the metrics records (``RUN_DIR/metrics.jsonl``, and as
TensorBoard scalars with ``train.tensorboard``), and each logged step's figures beside the
progress bar (:mod:`transduce.progress`), or as a log line where no bar is drawn."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any


from ..errors import require

if TYPE_CHECKING:
    from tqdm import tqdm

logger = logging.getLogger("transduce.training")

BAR_FIELDS = {"loss": "loss", "lr": "lr", "tokens_per_s": "tok/s"}  # a training record's keys beside the bar


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


class MetricsLog:
    """One JSON object a line in ``run_dir/metrics.jsonl`` (and TensorBoard scalars with
    ``tensorboard``), written by the first rank only."""

    def __init__(self, run_dir: Path, is_main: bool, tensorboard: bool):
        self.path, self.is_main = run_dir / "metrics.jsonl", is_main
        self.tensorboard = TensorBoardLog(run_dir / "tensorboard") if tensorboard and is_main else None

    def write(self, record: dict[str, Any]) -> None:
        if self.is_main:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
            if self.tensorboard is not None:
                self.tensorboard.write(record)

    def write_step(self, record: dict[str, Any], bar: tqdm, max_steps: int) -> None:
        """:meth:`write` a training record, and show its loss, lr and tokens/s beside the bar's
        step count; where no bar is drawn (not a terminal), as a log line."""
        self.write(record)
        if not bar.disable:
            bar.set_postfix({label: _fmt(record[k]) for k, label in BAR_FIELDS.items()}, refresh=False)
        elif self.is_main:
            logger.info(" ".join([f"step {record['step']}/{max_steps}"]
                                 + [f"{k} {_fmt(record[k])}" for k in BAR_FIELDS]))

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()


def _fmt(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 1e-2 else f"{v:.4g}" if abs(v) < 1e4 else f"{v:.0f}"
