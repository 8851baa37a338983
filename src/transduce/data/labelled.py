"""Labelled text for classification (``train.task: classify``): files of ``text<TAB>label`` lines,
or of ``text_a<TAB>text_b<TAB>label`` lines (sentence pairs: entailment, paraphrase).

A file holds one kind of row; a row with another number of fields, or an empty one, is an error
naming its file and line. The classes are the training file's labels, sorted (ids 0..K-1, saved
with the model as ``model.labels``); a validation or test label the training file lacks is an
error naming its file and line. Texts are encoded on the source side of an existing tokenizer
(a pre-trained model's).

An example's ids are its text's, or for a pair BERT's ``a [SEP] b`` (Devlin et al., 2019,
Sec. 3, "Input/Output Representations") with EOS as [SEP]; the model reads BOS + ids + EOS, and
:func:`transduce.data.batch.token_types` gives each position its segment (0 up to the first
EOS, 1 after it). ``transduce prepare`` (:func:`transduce.data.prepare.prepare_dataset`) writes
the ids as a split's source side and each example's one label id as its target side; the label
list goes into the manifest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from ..errors import DataError
from .tokenizer import EOS_ID, Tokenizer

Example = tuple[tuple[str, ...], str]  # (the text, or the two texts of a pair), label
ROW_FORMS = "text<TAB>label or text_a<TAB>text_b<TAB>label"


def read_labelled(path: str | Path) -> list[Example]:
    """The (texts, label) of each line of ``path``: one text, or two for a sentence pair.

    A line with another number of tab-separated fields, an empty field, or a kind of row other
    than the first line's is a DataError naming ``path:line``.
    """
    out: list[Example] = []
    try:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                *texts, label = line.rstrip("\r\n").split("\t")
                if len(texts) not in (1, 2) or not all(t.strip() for t in (*texts, label)):
                    raise DataError(f"{path}:{n}: expected {ROW_FORMS}; got {len(texts) + 1} field(s)"
                                    + (", one empty" if len(texts) in (1, 2) else ""))
                if out and len(texts) != len(out[0][0]):
                    raise DataError(f"{path}:{n}: {_kind(len(texts))}, but line 1 is {_kind(len(out[0][0]))} "
                                    "(one kind of row per file)")
                out.append((tuple(texts), label.strip()))
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 ({e.reason})") from None
    return out


def _kind(segments: int) -> str:
    return "a sentence pair" if segments == 2 else "a single text"


def segments_of(examples: Sequence[Example]) -> int:
    """1 for single texts, 2 for sentence pairs (0 for no examples)."""
    return len(examples[0][0]) if examples else 0


def check_labels(examples: Sequence[Example], labels: tuple[str, ...], path: str | Path | None) -> None:
    """A DataError naming ``path:line`` of the first example whose label is not in ``labels``."""
    known = set(labels)
    for n, (_, label) in enumerate(examples, 1):
        if label not in known:
            raise DataError(f"{path}:{n}: label {label!r} is not one of the {len(labels)} classes "
                            f"({', '.join(labels[:10])})")


def encode_example(tokenizer: Tokenizer, texts: Sequence[str], room: int) -> list[int]:
    """The ids of one example, at most ``room`` of them: a text's tokens, or a pair's ``a EOS b``
    cut longest-first (a token at a time from the end of the longer text, as BERT's tokenizers)."""
    rows = [tokenizer.encode(t, "src") for t in texts]
    if len(rows) == 1:
        return rows[0][:room]
    return sentence_pair(*rows, room)


def sentence_pair(a: Sequence[int], b: Sequence[int], room: int) -> list[int]:
    """BERT's ``a EOS b`` of two id rows, at most ``room`` ids: cut longest-first (a token at a
    time from the end of the longer row, as BERT's tokenizers)."""
    a, b = list(a), list(b)
    while a and b and len(a) + len(b) + 1 > room:
        (a if len(a) > len(b) else b).pop()
    return [*a, EOS_ID, *b]
