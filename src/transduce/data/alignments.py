"""Word alignments that travel with training pairs (guided alignment training, ``data.train_alignments``).

A file of Pharaoh ``i-j`` links (source word i, target word j, numbered from 0 in each line's
whitespace-separated words; fast_align's and eflomal's output), one line per pair of the training
source and target files, is read in step with them when the data is prepared: each line is checked
(``FILE:LINE`` errors: a malformed link, a word index beyond its sentence, more or fewer lines
than the corpus), the links of pairs the length filter drops are dropped with them, and the kept
pairs' links are written beside their ids (``train.align.npy``: (L, 2) int32 links, pair after
pair; ``train.align_offsets.npy``: (N + 1,) int64, pair i's links are rows ``off[i]:off[i + 1]``).
Training reads them by pair index, so bucketing, shuffling, resuming and DDP keep them with their
pair; :func:`alignment_targets` turns a batch's links into the (B, T, S) reference its guided
head's attention is trained towards (:mod:`transduce.training.guided`).

Subwords map to words through SentencePiece's ``▁`` word starts (:func:`word_index`), read from
the ids themselves, so a BPE-dropout segmentation maps as the usual one does. No torch at import
(``prepare``'s worker processes import this module).

Legend: B pairs, S source length (EOS counted), T target length (EOS counted).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import numpy as np

from transduce.data.corpus import read_lines
from transduce.data.hf_tokenizer import HFTokenizer
from transduce.errors import DataError

if TYPE_CHECKING:
    from torch import Tensor

WORD_START = "\u2581"  # SentencePiece's "▁"
LINKS, OFFSETS = "align.npy", "align_offsets.npy"

Alignment = list[tuple[int, int]]
_WORD_CHAR = re.compile(r"\w")


def word_index(pieces: Sequence[str]) -> list[int]:
    """The word number of each subword piece: a piece beginning with ``▁`` starts a new word
    (the first piece always belongs to word 0)."""
    out, word = [], -1
    for n, piece in enumerate(pieces):
        if n == 0 or piece.startswith(WORD_START):
            word += 1
        out.append(word)
    return out


def parse_links(line: str, where: str, error: type[Exception] = DataError) -> Alignment:
    """The links of a Pharaoh-format line (``i-j`` pairs separated by spaces; empty: none); a
    one-line ``error`` naming ``where`` for anything else."""
    links = []
    for item in line.split():
        i, sep, j = item.partition("-")
        if not (sep and i.isascii() and i.isdigit() and j.isascii() and j.isdigit()):
            raise error(f"{where}: expected i-j pairs of word numbers; got {item!r}")
        links.append((int(i), int(j)))
    return links


# ---- preparing: read, check and store the links of the kept pairs ----------------------------

class AlignedWriter:
    """A :class:`~transduce.data.prepared.SplitWriter` that also stores each kept pair's links,
    read line by line from ``path`` as the split's chunks arrive (``reverse``: the pairs are
    swapped, so are the links). Its chunks must carry their texts (``want_texts``)."""

    def __init__(self, writer: Any, path: str | os.PathLike, reverse: bool, corpus: tuple[str, str]):
        self.writer, self.path, self.reverse, self.corpus = writer, Path(path), reverse, corpus
        self.lines: Iterator[str] = read_lines(self.path)
        self.read = 0
        self.links: list[np.ndarray] = []
        self.counts: list[np.ndarray] = []

    def add(self, chunk: Any) -> None:
        if chunk.texts is None:
            raise ValueError("AlignedWriter: encode the chunks with want_texts=True")
        counts = []
        for (src, tgt), kept in zip(chunk.texts, chunk.kept):
            links = self._next(src, tgt)
            if kept:
                self.links.append(np.asarray(links, np.int32).reshape(-1, 2))
                counts.append(len(links))
        self.counts.append(np.asarray(counts, np.int64))
        self.writer.add(chunk)

    def _next(self, src: str, tgt: str) -> Alignment:
        line = next(self.lines, None)
        self.read += 1
        where = f"{self.path}:{self.read}"
        if line is None:
            raise DataError(f"{where}: the alignments end after {self.read - 1} lines, but the training corpus "
                            f"({self.corpus[0]}) has more; give one line of i-j links per pair")
        links = parse_links(line, where)
        if self.reverse:  # the pair is swapped already: (source, target) are the files' (target, source)
            links = [(j, i) for i, j in links]
        n_src, n_tgt = len(src.split()), len(tgt.split())
        for i, j in links:
            if i >= n_src or j >= n_tgt:
                raise DataError(f"{where}: link {i}-{j} is out of range: the pair has {n_src} source and "
                                f"{n_tgt} target words (numbered from 0)")
        return links

    def close(self) -> dict[str, Any]:
        if next(self.lines, None) is not None:
            extra = 1 + sum(1 for _ in self.lines)
            raise DataError(f"{self.path}:{self.read + 1}: {self.read + extra} lines of alignments, but the "
                            f"training corpus ({self.corpus[0]}) has {self.read}; give one line per pair")
        entry = self.writer.close()
        links = np.concatenate(self.links) if self.links else np.zeros((0, 2), np.int32)
        counts = np.concatenate(self.counts) if self.counts else np.zeros(0, np.int64)
        offsets = np.zeros(counts.size + 1, np.int64)
        np.cumsum(counts, out=offsets[1:])
        split = self.writer.split
        entry["files"].update(self.writer._save(f"{split}.{LINKS}", links))
        entry["files"].update(self.writer._save(f"{split}.{OFFSETS}", offsets))
        entry["alignments"] = int(links.shape[0])
        return entry

    @property
    def stats(self):
        return self.writer.stats


# ---- training: the links of a batch, and its reference ---------------------------------------

class PairLinks:
    """The stored links of one prepared split, by pair index (memory-mapped)."""

    def __init__(self, root: Path, split: str):
        self.links = np.load(root / f"{split}.{LINKS}", mmap_mode="r", allow_pickle=False)
        self.offsets = np.load(root / f"{split}.{OFFSETS}", mmap_mode="r", allow_pickle=False)

    def __len__(self) -> int:
        return self.offsets.shape[0] - 1

    def __getitem__(self, i: int) -> np.ndarray:
        """Pair ``i``'s links, (k, 2) (source word, target word)."""
        return np.asarray(self.links[self.offsets[i]:self.offsets[i + 1]])


def word_starts(tokenizer: Any, side: str, vocab_size: int) -> np.ndarray:
    """(V,) bool: which ids start a word (their piece begins with ``▁``)."""
    return np.fromiter((p.startswith(WORD_START) for p in tokenizer.pieces(range(vocab_size), side)), bool,
                       vocab_size)


def word_continuations(tokenizer: Any, side: str, vocab_size: int) -> np.ndarray | None:
    """(vocab_size,) bool: which ids continue the word before them: SentencePiece pieces without
    ``▁`` whose first character is a word character (``\\w``: letter, digit, ``_``); punctuation,
    special tokens and ids past the tokenizer's vocabulary do not. None for a Hugging Face
    tokenizer (byte-level BPE and WordPiece mark words otherwise)."""
    if isinstance(tokenizer, HFTokenizer):
        return None
    n = min(vocab_size, tokenizer.tgt_vocab_size if side == "tgt" else tokenizer.src_vocab_size)
    out = np.zeros(vocab_size, bool)
    out[:n] = [not p.startswith(WORD_START) and _WORD_CHAR.match(p) is not None
               for p in tokenizer.pieces(range(n), side)]
    return out


def words_of(ids: Sequence[int], starts: np.ndarray) -> np.ndarray:
    """The word number of each id, as :func:`word_index` of their pieces."""
    begins = starts[np.asarray(ids, np.int64)]
    if begins.size:
        begins[0] = True
    return np.cumsum(begins) - 1


def reference(links: Sequence[tuple[int, int]] | np.ndarray, src_words: Sequence[int], tgt_words: Sequence[int],
              s: int, t: int) -> "Tensor":
    """The (T, S) reference of one pair: row j, for target piece j, uniform over the source pieces
    of the words linked to piece j's word (a zero row: no link). Links to words beyond either
    side's pieces (a sentence cut at the length limit) are ignored. ``s`` >= len(src_words) and
    ``t`` >= len(tgt_words) leave room for EOS and padding (zero)."""
    import torch
    ref = torch.zeros(t, s)
    src_of: dict[int, list[int]] = {}
    for p, w in enumerate(src_words):
        src_of.setdefault(int(w), []).append(p)
    linked: dict[int, list[int]] = {}
    for i, j in links:
        linked.setdefault(int(j), []).extend(src_of.get(int(i), []))
    for p, w in enumerate(tgt_words):
        if linked.get(int(w)):
            ref[p, linked[int(w)]] = 1.0
    return ref / ref.sum(dim=1, keepdim=True).clamp(min=1.0)


def alignment_targets(links: Sequence[np.ndarray], src_rows: Sequence[Sequence[int]],
                      tgt_rows: Sequence[Sequence[int]], starts: tuple[np.ndarray, np.ndarray],
                      s: int, t: int) -> "Tensor":
    """A batch's (B, T, S) reference from each pair's links and raw ids (``starts``: the source and
    target :func:`word_starts`)."""
    import torch
    return torch.stack([reference(lk, words_of(src, starts[0]), words_of(tgt, starts[1]), s, t)
                        for lk, src, tgt in zip(links, src_rows, tgt_rows)])
