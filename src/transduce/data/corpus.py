"""Reading, validating and encoding parallel text, and collating it into model batches.

Model input convention (the decoder is trained with teacher forcing, paper Section 3.1)::

    pair (raw token ids):  src = [a, b, c]        tgt = [x, y]
    source ids:            [a, b, c, EOS]          encoder input            (B, S)
    target input:          [BOS, x, y]             decoder input            (B, T)
    target labels:         [x, y, EOS]             what the decoder predicts (B, T)

Pairs hold raw token ids; :func:`collate` adds EOS/BOS and pads with PAD_ID (0).
Length limits (``max_len``) count raw tokens, so the model sees at most ``max_len + 1``.
"""

from __future__ import annotations

import gzip
import logging
import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import torch

from transduce.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer
from transduce.errors import DataError

logger = logging.getLogger(__name__)

GZIP_MAGIC = b"\x1f\x8b"

Pair = tuple[list[int], list[int]]  # raw token ids (no BOS/EOS) of a source and a target


# ---- reading ---------------------------------------------------------------------------------

def read_lines(path: str | os.PathLike) -> Iterator[str]:
    """Stream the lines of a UTF-8 text file, plain or gzip (detected by magic bytes).

    Only the line terminator (``\\n`` or ``\\r\\n``) is stripped, plus a UTF-8 byte-order mark
    at the very start of the file. The file is checked when this is called; lines are read
    lazily.

    Raises:
        DataError: missing file, invalid UTF-8 (``FILE:LINE: invalid UTF-8 ...``), a NUL byte
            (binary file) or a corrupt gzip stream.
    """
    path = Path(path)
    return _iter_lines(path, _is_gzip(path))


def _iter_lines(path: Path, gzipped: bool) -> Iterator[str]:
    for lineno, raw in enumerate(_iter_raw(path, gzipped), start=1):
        yield decode_line(raw, path, lineno)


def read_raw_lines(path: str | os.PathLike) -> Iterator[bytes]:
    """The lines of a plain or gzip file as undecoded bytes (checked as :func:`read_lines` is).

    For readers that decode elsewhere (in worker processes) with :func:`decode_line`.
    """
    path = Path(path)
    return _iter_raw(path, _is_gzip(path))


def _iter_raw(path: Path, gzipped: bool) -> Iterator[bytes]:
    lineno = 0
    try:
        with (gzip.open(path, "rb") if gzipped else open(path, "rb")) as handle:
            for lineno, raw in enumerate(handle, start=1):
                yield raw
    except (OSError, EOFError, zlib.error) as err:  # gzip.BadGzipFile is an OSError
        raise DataError(f"{path}:{lineno + 1}: cannot read: {_one_line(err)}") from err


def _is_gzip(path: Path) -> bool:
    """Check that ``path`` is a readable file; True if it starts with the gzip magic."""
    if not path.exists():
        raise DataError(f"{path}: no such file")
    if not path.is_file():
        raise DataError(f"{path}: not a regular file")
    try:
        with open(path, "rb") as probe:
            return probe.read(2) == GZIP_MAGIC
    except OSError as err:
        raise DataError(f"{path}: cannot open ({err.strerror or err})") from err


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())


def decode_line(raw: bytes, path: str | os.PathLike, lineno: int) -> str:
    """One line's text: terminator and (on line 1) a byte-order mark stripped, UTF-8 checked."""
    if raw.endswith(b"\n"):
        raw = raw[:-2] if raw.endswith(b"\r\n") else raw[:-1]
    if b"\x00" in raw:
        raise DataError(f"{path}:{lineno}: NUL byte; this looks like a binary file, not text")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(
            f"{path}:{lineno}: invalid UTF-8 at byte {err.start} of the line "
            f"({raw[err.start:err.start + 4]!r})") from err
    if lineno == 1 and text.startswith("\ufeff"):
        text = text[1:]
    return text


def read_parallel(src_path: str | os.PathLike, tgt_path: str | os.PathLike
                  ) -> Iterator[tuple[str, str]]:
    """Stream aligned ``(source, target)`` lines; different line counts raise DataError.

    Both files are checked when this is called; the count mismatch is found when the shorter
    file ends, and the message names both files and both counts.
    """
    return _zip_strict(src_path, tgt_path, read_lines(src_path), read_lines(tgt_path))


def read_parallel_raw(src_path: str | os.PathLike, tgt_path: str | os.PathLike) -> Iterator[tuple[bytes, bytes]]:
    """:func:`read_parallel` without decoding: aligned raw line pairs (see :func:`decode_line`)."""
    return _zip_strict(src_path, tgt_path, read_raw_lines(src_path), read_raw_lines(tgt_path))


def _zip_strict(src_path, tgt_path, src_iter: Iterator[str], tgt_iter: Iterator[str]
                ) -> Iterator[tuple[str, str]]:
    n = 0
    while True:
        src = next(src_iter, None)
        tgt = next(tgt_iter, None)
        if src is None and tgt is None:
            return
        if src is None or tgt is None:
            _raise_misaligned(src_path, tgt_path, n, src_iter if tgt is None else tgt_iter,
                              short_is_src=src is None)
        n += 1
        yield src, tgt


def _raise_misaligned(src_path, tgt_path, n: int, rest: Iterator[str], short_is_src: bool):
    """Count the longer file's remaining lines and raise a DataError naming both files."""
    longer = n + 1 + sum(1 for _ in rest)
    short, long_ = (src_path, tgt_path) if short_is_src else (tgt_path, src_path)
    raise DataError(f"line counts differ: {short} ends after {n} lines but {long_} has {longer} "
                    f"(first unmatched line {n + 1})")


# ---- filtering and encoding -----------------------------------------------------------------

@dataclass
class FilterStats:
    """What :func:`encode_chunk` kept and why it dropped the rest."""

    kept: int = 0
    empty: int = 0
    too_long: int = 0
    bad_ratio: int = 0

    @property
    def total(self) -> int:
        return self.kept + self.empty + self.too_long + self.bad_ratio

    def summary(self) -> str:
        """One line, e.g. ``kept 28,990 of 29,000 pairs (empty 0, too long 8, bad ratio 2)``."""
        return (f"kept {self.kept:,} of {self.total:,} pairs (empty {self.empty:,}, "
                f"too long {self.too_long:,}, bad ratio {self.bad_ratio:,})")


@dataclass
class EncodedChunk:
    """The kept pairs of a chunk of lines as flat token arrays, and what was dropped.

    ``src_tokens[sum(src_lens[:i]):][:src_lens[i]]`` are the raw ids (no BOS/EOS) of kept pair
    ``i``; ``texts`` holds the decoded lines of every pair read (kept or not) when asked for,
    and ``kept`` marks which of them were kept.
    """

    src_tokens: np.ndarray
    src_lens: np.ndarray
    tgt_tokens: np.ndarray
    tgt_lens: np.ndarray
    kept: np.ndarray  # (lines,) bool
    stats: FilterStats
    texts: list[tuple[str, str]] | None = field(default=None)


def encode_chunk(src_raw: Sequence[bytes], tgt_raw: Sequence[bytes], first_line: int, names: tuple[str, str],
                 tokenizer: Tokenizer, max_len: int, max_ratio: float, dtype: str, want_texts: bool = False,
                 threads: int = 1) -> EncodedChunk:
    """Decode, encode and filter aligned raw lines ``first_line, first_line + 1, ...`` of two files.

    A pair is dropped, checked in this order, if either side encodes to no tokens (``empty``),
    either side has more than ``max_len`` tokens (``too_long``), or the longer side has more
    than ``max_ratio`` times the tokens of the shorter (``bad_ratio``). Bad bytes raise the same
    ``FILE:LINE`` DataError as :func:`read_lines` (``names`` are the two files' names).
    """
    src_text = [decode_line(raw, names[0], first_line + i) for i, raw in enumerate(src_raw)]
    tgt_text = [decode_line(raw, names[1], first_line + i) for i, raw in enumerate(tgt_raw)]
    src_ids = tokenizer.encode_batch(src_text, side="src", num_threads=threads)
    tgt_ids = tokenizer.encode_batch(tgt_text, side="tgt", num_threads=threads)
    stats = FilterStats()
    kept = np.zeros(len(src_ids), dtype=bool)
    for i, (src, tgt) in enumerate(zip(src_ids, tgt_ids)):
        verdict = _verdict(len(src), len(tgt), max_len, max_ratio)
        kept[i] = verdict == "kept"
        setattr(stats, verdict, getattr(stats, verdict) + 1)
    columns = []
    for ids in (src_ids, tgt_ids):
        rows = [ids[i] for i in np.flatnonzero(kept)]
        lens = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
        flat = np.fromiter((t for row in rows for t in row), dtype=dtype, count=int(lens.sum()))
        columns += [flat, lens]
    texts = list(zip(src_text, tgt_text)) if want_texts else None
    return EncodedChunk(*columns, kept=kept, stats=stats, texts=texts)


def sample_tokens(texts: Sequence[tuple[str, str]], usual: tuple[list, list], tokenizer: Tokenizer,
                  dropout: float, sides: str, seed: int, max_len: int) -> tuple[list, list]:
    """BPE-dropout segmentation (subword regularisation) of kept training pairs.

    ``usual`` holds the pairs' usual ids per side (``[src_rows, tgt_rows]``), aligned with
    ``texts``. The ``sides`` ("src", "tgt" or "both") are re-encoded with
    :meth:`Tokenizer.sample_batch`; a sampled side longer than ``max_len`` (or empty) keeps its
    usual segmentation, so no pair outgrows the length limit it was filtered with.
    Deterministic in ``seed``.
    """
    if any(len(column) != len(texts) for column in usual):
        raise ValueError(f"{len(texts)} texts but {len(usual[0])} encoded pairs")
    columns = list(usual)
    for k, side in enumerate(("src", "tgt")):
        if sides in (side, "both"):
            sampled = tokenizer.sample_batch([t[k] for t in texts], side, dropout,
                                             zlib.crc32(f"{seed}:{side}".encode()))
            columns[k] = [ids if 0 < len(ids) <= max_len else old for ids, old in zip(sampled, columns[k])]
    return columns[0], columns[1]


def _verdict(n_src: int, n_tgt: int, max_len: int, max_ratio: float) -> str:
    """The FilterStats field a pair with these token counts belongs to."""
    if n_src == 0 or n_tgt == 0:
        return "empty"
    if n_src > max_len or n_tgt > max_len:
        return "too_long"
    if max(n_src, n_tgt) > max_ratio * min(n_src, n_tgt):
        return "bad_ratio"
    return "kept"


# ---- collation ------------------------------------------------------------------------------

@dataclass
class Batch:
    """Padded model inputs for one batch (see the module docstring for the convention).

    Shape:
        src: (B, S) source ids + EOS, PAD-padded.
        tgt_in: (B, T) BOS + target ids, PAD-padded.
        tgt_out: (B, T) target ids + EOS, PAD-padded; PAD positions are ignored by the loss.
    """

    src: torch.Tensor
    tgt_in: torch.Tensor
    tgt_out: torch.Tensor
    n_src_tokens: int  # non-pad source positions (EOS included)
    n_tgt_tokens: int  # non-pad labels (EOS included): the loss normaliser

    def to(self, device: torch.device | str) -> "Batch":
        """A copy with the tensors on ``device`` (non-blocking where possible)."""
        return Batch(self.src.to(device, non_blocking=True),
                     self.tgt_in.to(device, non_blocking=True),
                     self.tgt_out.to(device, non_blocking=True),
                     self.n_src_tokens, self.n_tgt_tokens)

    def __len__(self) -> int:
        return self.src.size(0)


def collate(pairs: Sequence[tuple[Sequence[int], Sequence[int]]], pad_id: int = PAD_ID) -> Batch:
    """Build a :class:`Batch` from raw-id pairs (lists or arrays), adding EOS to sources and BOS/EOS
    to targets."""
    if not len(pairs):
        raise ValueError("collate: empty list of pairs")
    src = _pad([s for s, _ in pairs], False, pad_id)     # (B, S)
    tgt_in = _pad([t for _, t in pairs], True, pad_id)   # (B, T)
    tgt_out = _pad([t for _, t in pairs], False, pad_id)  # (B, T)
    n_src = sum(len(s) + 1 for s, _ in pairs)
    n_tgt = sum(len(t) + 1 for _, t in pairs)
    return Batch(src, tgt_in, tgt_out, n_src, n_tgt)


def _pad(rows: list[Sequence[int]], bos: bool, pad_id: int) -> torch.Tensor:
    """``[BOS] + row`` (``bos``) or ``row + [EOS]`` for each row, right-padded: a (B, width) long tensor."""
    width = max(len(r) for r in rows) + 1
    out = np.full((len(rows), width), pad_id, dtype=np.int64)
    for i, row in enumerate(rows):
        if bos:
            out[i, 0] = BOS_ID
            out[i, 1:len(row) + 1] = row
        else:
            out[i, :len(row)] = row
            out[i, len(row)] = EOS_ID
    return torch.from_numpy(out)
