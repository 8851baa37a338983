"""Training's reports: the progress bar (:class:`transduce.progress.Progress`, in steps) and the
metrics records as TensorBoard scalars (``train.tensorboard``)."""

from __future__ import annotations

from pathlib import Path

from ..errors import require
from ..progress import Progress

__all__ = ["Progress", "TensorBoardLog"]


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
