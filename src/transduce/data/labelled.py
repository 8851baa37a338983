"""Labelled text for classification (``train.task: classify``): files of ``text<TAB>label`` lines.

The label is what follows the last tab of a line. The classes are the training file's labels,
sorted (ids 0..K-1, saved with the model as ``model.labels``); a validation or test label the
training file lacks is an error naming its file and line. Texts are encoded on the source side
of an existing tokenizer (a pre-trained model's) and cut to ``data.max_len`` tokens.

A classification set is held in memory as :class:`~transduce.data.prepared.TokenPairs` whose
target of each pair is its one label id, so the Trainer batches, shuffles and resumes it as it
does prepared pairs (classification sets are small; nothing is written to disk).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..config import DataConfig
from ..errors import DataError
from .prepared import TokenPairs, length_dtype
from .tokenizer import Tokenizer

SPLITS = ("train", "valid", "test")


def read_labelled(path: str | Path) -> list[tuple[str, str]]:
    """The (text, label) of each line of ``path``; a line without a tab, or with an empty text or
    label, is a DataError naming ``path:line``."""
    out = []
    try:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                text, tab, label = line.rstrip("\r\n").rpartition("\t")
                if not tab or not text.strip() or not label.strip():
                    raise DataError(f"{path}:{n}: expected text<TAB>label")
                out.append((text, label.strip()))
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror})") from None
    return out


def check_labels(examples: list[tuple[str, str]], labels: tuple[str, ...], path: str | Path | None) -> None:
    """A DataError naming ``path:line`` of the first example whose label is not in ``labels``."""
    known = set(labels)
    for n, (_, label) in enumerate(examples, 1):
        if label not in known:
            raise DataError(f"{path}:{n}: label {label!r} is not one of the {len(labels)} classes "
                            f"({', '.join(labels[:10])})")


@dataclass
class LabelledData:
    """One run's classification data: what the Trainer reads of a :class:`PreparedData`."""

    root: Path                    # the training file (named in errors)
    tokenizer: Tokenizer
    labels: tuple[str, ...]       # class id -> name
    splits: dict[str, TokenPairs]

    def split(self, name: str) -> TokenPairs:
        return self.splits[name]

    def texts(self, name: str) -> list[tuple[str, str]]:
        """No reference texts: classification is scored on its labels, not by BLEU."""
        return []


def load_labelled(cfg: DataConfig, tokenizer: Tokenizer, labels: tuple[str, ...] = ()) -> LabelledData:
    """Read and encode ``cfg``'s ``train_src``/``valid_src``/``test_src`` label files.

    ``labels``: the classes to use (a model's, to score it); by default the training file's.
    """
    rows = {name: read_labelled(p) for name in SPLITS if (p := getattr(cfg, f"{name}_src")) is not None}
    if not labels:
        labels = tuple(sorted({label for _, label in rows["train"]}))
    ids = {label: i for i, label in enumerate(labels)}
    splits = {}
    for name in SPLITS:
        examples = rows.get(name, [])
        check_labels(examples, labels, getattr(cfg, f"{name}_src"))
        tokens = [tokenizer.encode(text, "src")[:cfg.max_len] for text, _ in examples]
        splits[name] = TokenPairs.from_rows(tokens, [[ids[label]] for _, label in examples], np.dtype("<i4"),
                                            length_dtype(cfg.max_len))
    return LabelledData(Path(cfg.train_src or ""), tokenizer, labels, splits)
