"""Encoding many lines a word at a time: the same ids as SentencePiece, a few times faster.

SentencePiece normalises a line (``nmt_nfkc``), splits it at spaces, and segments every word on
its own: no piece of a model trained with ``split_by_whitespace`` (the default) spans a space,
so neither BPE merges nor the unigram lattice connect two words. A line's ids are therefore its
words' ids one after another, provided normalisation moves no space, which two checks make sure
of: the line holds no whitespace but plain spaces (a no-break space or a tab, which
normalisation maps or removes, fails), and each of its words is unchanged by normalisation
(checked once per distinct word; ``¨``, full-width forms or control characters fail). Lines that
fail either check are encoded whole by SentencePiece. A corpus repeats its words far more often
than its lines, so most words are looked up rather than segmented: this is what subword-nmt's
and fastBPE's word caches do. ``tests/data/test_wordcache.py`` checks the ids against
SentencePiece's own on real and adversarial text, for BPE and unigram models.
"""

from __future__ import annotations

import re
from itertools import chain, repeat
from typing import Sequence

import numpy as np
import sentencepiece as spm

_OTHER_SPACE = re.compile(r"[^\S ]")  # whitespace that is not a plain space
_UNSAFE = -1


def word_separable(sp: spm.SentencePieceProcessor) -> bool:
    """Whether ``sp`` segments every word on its own, which the cache relies on: no piece holds a
    word boundary other than its leading one (``split_by_whitespace``, boundaries marked at the
    start), and runs of spaces collapse behind a dummy prefix. Our tokenizers always pass; a
    model trained elsewhere with other options is encoded a line at a time instead."""
    if sp.normalize("a  b") != "\u2581a\u2581b":
        return False
    return not any("\u2581" in sp.id_to_piece(i)[1:] for i in range(sp.get_piece_size()))


class WordCache:
    """Ids of single words for one SentencePiece model, at most ``limit`` words kept (~100 bytes each).

    Entry 0 is the empty word (what ``split(" ")`` yields between two spaces): no ids.
    """

    def __init__(self, sp: spm.SentencePieceProcessor, limit: int = 500_000):
        self.sp, self.limit = sp, limit
        self.index: dict[str, int] = {"": 0}
        self.starts = np.zeros(1024, dtype=np.int64)  # entry -> first id in ``tokens``
        self.lens = np.zeros(1024, dtype=np.int64)
        self.tokens = np.zeros(1 << 16, dtype=np.int32)
        self.n_entries, self.n_tokens = 1, 0

    def encode(self, texts: Sequence[str], threads: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """The ids of ``texts`` one line after another, and each line's length: (T,) int32, (N,) int64."""
        odd = np.fromiter((_OTHER_SPACE.search(t) is not None for t in texts), dtype=bool, count=len(texts))
        words = [[] if o else t.split(" ") for t, o in zip(texts, odd)]
        flat = list(chain.from_iterable(words))
        self._add(flat)
        entry = np.fromiter(map(self.index.get, flat, repeat(_UNSAFE)), dtype=np.int64, count=len(flat))
        counts = np.fromiter(map(len, words), dtype=np.int64, count=len(words))
        line_of = np.repeat(np.arange(len(texts)), counts)           # (W,) the line of each word
        whole = odd.copy()                                            # lines SentencePiece encodes whole
        whole[line_of[entry == _UNSAFE]] = True
        entry[whole[line_of] | (entry == _UNSAFE)] = 0                # their words take no ids here
        wl, ws = self.lens[entry], self.starts[entry]                 # (W,) each word's ids
        ids = self.tokens[np.repeat(ws - (np.cumsum(wl) - wl), wl) + np.arange(int(wl.sum()))]
        lengths = np.bincount(line_of, weights=wl, minlength=len(texts)).astype(np.int64)
        if not whole.any():
            return ids, lengths
        rows = np.flatnonzero(whole)
        encoded = self.sp.encode([texts[i] for i in rows], out_type=int, num_threads=threads)
        lengths[rows] = [len(r) for r in encoded]
        starts = np.cumsum(lengths) - lengths
        pieces, at, placed = [], 0, 0  # ``ids`` holds the other lines: splice these in
        for i, row in zip(rows, encoded):
            before = int(starts[i]) - placed  # ids of the other lines before line i
            pieces += [ids[at:before], np.asarray(row, dtype=np.int32)]
            at, placed = before, placed + len(row)
        pieces.append(ids[at:])
        return np.concatenate(pieces), lengths

    def _add(self, words: list[str]) -> None:
        """Segment the words not seen before, each on its own. A full cache starts again empty
        (cheaper than tracking use: the next lines' words come back at once), and when one call
        has more distinct words than fit, the rest leave their lines to SentencePiece."""
        new = set(words).difference(self.index)
        if not new:
            return
        if len(self.index) + len(new) > self.limit:
            self.index, self.n_entries, self.n_tokens = {"": 0}, 1, 0
            new = set(words).difference(self.index)
        room = self.limit - len(self.index)
        new = sorted(new)[:room] if len(new) > room else list(new)
        normal = [self.sp.normalize(w) for w in new]
        safe = [w for w, n in zip(new, normal) if n == "\u2581" + w]
        self.index.update((w, _UNSAFE) for w, n in zip(new, normal) if n != "\u2581" + w)
        rows = self.sp.encode(safe, out_type=int)
        lens = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
        first = self.n_entries
        self._grow(first + len(rows), self.n_tokens + int(lens.sum()))
        self.lens[first:first + len(rows)] = lens
        self.starts[first:first + len(rows)] = self.n_tokens + np.cumsum(lens) - lens
        self.tokens[self.n_tokens:self.n_tokens + int(lens.sum())] = np.fromiter(
            chain.from_iterable(rows), dtype=np.int32, count=int(lens.sum()))
        self.index.update(zip(safe, range(first, first + len(rows))))
        self.n_entries, self.n_tokens = first + len(rows), self.n_tokens + int(lens.sum())

    def _grow(self, entries: int, tokens: int) -> None:
        if entries > self.lens.size:
            size = max(entries, 2 * self.lens.size)
            self.lens = np.resize(self.lens, size)
            self.starts = np.resize(self.starts, size)
        if tokens > self.tokens.size:
            self.tokens = np.resize(self.tokens, max(tokens, 2 * self.tokens.size))
