"""Reading, validating, encoding and filtering parallel text.

Pairs hold raw token ids (no BOS/EOS; :func:`transduce.data.batch.collate` adds them). Length
limits (``max_len``) count raw tokens, so the model sees at most ``max_len + 1``. No torch here:
``prepare``'s worker processes import this module, and start faster without it.
"""

from __future__ import annotations

import gzip
import logging
import os
import zlib
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np

from transduce.data.tokenizer import Tokenizer
from transduce.errors import DataError, one_line

logger = logging.getLogger(__name__)

GZIP_MAGIC = b"\x1f\x8b"


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
    return _iter_lines(path, is_gzip(path))


def _iter_lines(path: Path, gzipped: bool) -> Iterator[str]:
    for lineno, raw in enumerate(_iter_raw(path, gzipped), start=1):
        yield decode_line(raw, path, lineno)


def _iter_raw(path: Path, gzipped: bool) -> Iterator[bytes]:
    lineno = 0
    try:
        with (gzip.open(path, "rb") if gzipped else open(path, "rb")) as handle:
            for lineno, raw in enumerate(handle, start=1):
                yield raw
    except (OSError, EOFError, zlib.error) as err:  # gzip.BadGzipFile is an OSError
        raise DataError(f"{path}:{lineno + 1}: cannot read: {one_line(err)}") from err


def is_gzip(path: Path) -> bool:
    """Check that ``path`` is a readable file (a one-line DataError if not); True if it is gzip."""
    if not path.exists():
        raise DataError(f"{path}: no such file")
    if not path.is_file():
        raise DataError(f"{path}: not a regular file")
    try:
        with open(path, "rb") as probe:
            return probe.read(2) == GZIP_MAGIC
    except OSError as err:
        raise DataError(f"{path}: cannot open ({err.strerror or err})") from err


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


def decode_lines(raws: Sequence[bytes], path: str | os.PathLike, first_line: int) -> list[str]:
    """:func:`decode_line` of consecutive lines ``first_line, first_line + 1, ...``, decoded in one go.

    Lines as files give them (each ended by one ``\n``, but perhaps the last) are joined and
    decoded at once; anything else, or bad bytes anywhere, goes through :func:`decode_line` line
    by line, which names the first bad one.
    """
    if not raws:
        return []
    joined = b"".join(raws)
    try:
        if b"\x00" in joined or joined.count(b"\n") != len(raws) - (not raws[-1].endswith(b"\n")):
            raise ValueError("a NUL byte, or lines not ended by one newline each")
        text = joined.decode("utf-8")
    except ValueError:  # UnicodeDecodeError is one
        return [decode_line(raw, path, first_line + i) for i, raw in enumerate(raws)]
    lines = text.split("\n")
    if joined.endswith(b"\n"):
        lines.pop()
    if "\r" in text:  # a "\r\n" ending loses its "\r" too (not a "\r" at the very end of a file)
        last = len(lines) - (0 if joined.endswith(b"\n") else 1)
        lines = [line[:-1] if i < last and line.endswith("\r") else line for i, line in enumerate(lines)]
    if first_line == 1 and lines and lines[0].startswith("\ufeff"):
        lines[0] = lines[0][1:]
    return lines


def read_parallel(src_path: str | os.PathLike, tgt_path: str | os.PathLike
                  ) -> Iterator[tuple[str, str]]:
    """Stream aligned ``(source, target)`` lines; different line counts raise DataError.

    Both files are checked when this is called; the count mismatch is found when the shorter
    file ends (after the lines both have), and the message names both files and both counts.
    """
    chunks = read_parallel_chunks(src_path, tgt_path)
    return decode_chunks(chunks, str(src_path), str(tgt_path))


def decode_chunks(chunks: Iterable[tuple[list[bytes], list[bytes]]], src_name: str, tgt_name: str
                  ) -> Iterator[tuple[str, str]]:
    """The text pairs of aligned raw chunks (see :func:`read_parallel_chunks`), lines numbered from 1."""
    first = 1
    for src, tgt in chunks:
        yield from zip(decode_lines(src, src_name, first), decode_lines(tgt, tgt_name, first))
        first += len(src)


def read_parallel_chunks(src_path: str | os.PathLike, tgt_path: str | os.PathLike, size: int = 20_000
                         ) -> Iterator[tuple[list[bytes], list[bytes]]]:
    """Aligned chunks of ``size`` undecoded lines of two files (see :func:`decode_lines`).

    Lines are read in C (``islice`` over the file), not one Python step each. Checked as
    :func:`read_parallel` is: the files when this is called, the line counts at the end (the
    aligned lines come first, then the DataError).
    """
    paths = Path(src_path), Path(tgt_path)
    return _read_chunks(paths, [is_gzip(p) for p in paths], size)


def read_tsv_chunks(path: str | os.PathLike, size: int = 20_000) -> Iterator[tuple[list[bytes], list[bytes]]]:
    """A text-to-text file's ``input<TAB>target`` lines (``data.corpus: tsv``; T5, Raffel et al.,
    2020, Sec. 2.4) as aligned chunks of ``size`` raw (input, target) lines, as
    :func:`read_parallel_chunks` gives two files'. Each line is checked as it is read: invalid
    UTF-8, a NUL byte, other than one TAB or an empty side is a DataError naming ``path:line``."""
    path = Path(path)
    return _tsv_chunks(path, is_gzip(path), size)


def _tsv_chunks(path: Path, gzipped: bool, size: int) -> Iterator[tuple[list[bytes], list[bytes]]]:
    with _open(path, gzipped) as handle:
        n = 0
        while raws := _take(handle, size, path, n):
            pairs = [split_tsv_line(raw, path, n + i + 1) for i, raw in enumerate(raws)]
            yield [f"{s}\n".encode() for s, _ in pairs], [f"{t}\n".encode() for _, t in pairs]
            n += len(raws)


def split_tsv_line(raw: bytes, path: str | os.PathLike, lineno: int) -> tuple[str, str]:
    """One ``input<TAB>target`` line's two sides, or a DataError naming ``path:lineno``."""
    fields = decode_line(raw, path, lineno).split("\t")
    if len(fields) != 2:
        raise DataError(f"{path}:{lineno}: expected input<TAB>target (one TAB); got {len(fields) - 1} TABs")
    for side, text in zip(("input", "target"), fields):
        if not text.strip():
            raise DataError(f"{path}:{lineno}: expected input<TAB>target; the {side} is empty")
    return fields[0], fields[1]


def _read_chunks(paths: tuple[Path, Path], gzipped: list[bool], size: int
                 ) -> Iterator[tuple[list[bytes], list[bytes]]]:
    with _open(paths[0], gzipped[0]) as src, _open(paths[1], gzipped[1]) as tgt:
        n = 0
        while True:
            s, t = _take(src, size, paths[0], n), _take(tgt, size, paths[1], n)
            m = min(len(s), len(t))
            if m:
                yield (s, t) if len(s) == len(t) else (s[:m], t[:m])
            if len(s) != len(t):
                short, long_ = (0, 1) if len(s) < len(t) else (1, 0)
                read = n + max(len(s), len(t))
                longer = read + _count(tgt if long_ else src, paths[long_], read)
                raise DataError(f"line counts differ: {paths[short]} ends after {n + m} lines but {paths[long_]} "
                                f"has {longer} (first unmatched line {n + m + 1})")
            if len(s) < size:
                return
            n += m


def _open(path: Path, gzipped: bool):
    return gzip.open(path, "rb") if gzipped else open(path, "rb")


def _take(handle, size: int, path: Path, before: int) -> list[bytes]:
    """The next ``size`` lines (fewer at the end); a read error names the line it stopped at."""
    lines: list[bytes] = []
    try:
        lines.extend(islice(handle, size))  # keeps what it read if the stream breaks
    except (OSError, EOFError, zlib.error) as err:  # gzip.BadGzipFile is an OSError
        raise DataError(f"{path}:{before + len(lines) + 1}: cannot read: {one_line(err)}") from err
    return lines


def _count(handle, path: Path, before: int) -> int:
    """How many lines are left in ``handle`` (``before`` were read)."""
    total = 0
    while block := _take(handle, 1 << 16, path, before + total):
        total += len(block)
    return total


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
    src_text, tgt_text = (decode_lines(raw, name, first_line) for raw, name in zip((src_raw, tgt_raw), names))
    (src_ids, src_lens), (tgt_ids, tgt_lens) = (tokenizer.encode_flat(text, side, threads)
                                                for text, side in ((src_text, "src"), (tgt_text, "tgt")))
    verdicts = _verdicts(src_lens, tgt_lens, max_len, max_ratio)
    kept = verdicts == 0
    stats = FilterStats(*np.bincount(verdicts, minlength=4).tolist())
    columns = []
    for ids, lens in ((src_ids, src_lens), (tgt_ids, tgt_lens)):
        ids = ids if kept.all() else ids[np.repeat(kept, lens)]
        columns += [ids.astype(dtype), lens[kept]]
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


def _verdicts(n_src: np.ndarray, n_tgt: np.ndarray, max_len: int, max_ratio: float) -> np.ndarray:
    """Per pair, the index of the FilterStats field it counts in: 0 kept, 1 empty, 2 too long, 3 bad ratio."""
    out = np.zeros(n_src.shape, dtype=np.int64)
    bad_ratio = np.maximum(n_src, n_tgt) > max_ratio * np.minimum(n_src, n_tgt)
    out[bad_ratio] = 3
    out[(n_src > max_len) | (n_tgt > max_len)] = 2
    out[(n_src == 0) | (n_tgt == 0)] = 1  # checked last, so it wins: the order of the checks
    return out
