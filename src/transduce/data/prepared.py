"""A prepared dataset: every split's token ids in flat files, opened memory-mapped.

Prepare once (``transduce prepare``, :func:`transduce.data.prepare.prepare_dataset`), then only
open: training reads the ids through memory maps, so its memory does not grow with the corpus,
and a restart does not redo the encoding. The layout of ``DATA_DIR``::

    manifest.json            what was read (the data settings, each input file's sha256), what was
                             kept (filter statistics, token counts), and every file's size and sha256
    tokenizer/               the SentencePiece model(s) the ids come from
    {split}.src.bin          the kept pairs' source ids, one pair after another, no BOS/EOS (a classification
                             set: each example's ids, and its label id as the target; see data/labelled.py)
    {split}.tgt.bin          (uint16 when the vocabulary fits, else uint32; little-endian)
    {split}.offsets.npy      (N + 1, 2) int64: pair i's source is src.bin[off[i, 0]:off[i + 1, 0]]
    {split}.lengths.npy      (N, 2) source and target lengths: what the batch planner reads
    {split}.text.{src,tgt}   text, one line per pair: valid/test every pair read (for BLEU); train
    {split}.text.npy         the kept pairs, only when prepared for BPE-dropout; (M + 1, 2) int64
                             byte offsets of each line
    {split}.align.npy        train only, with ``data.train_alignments``: the kept pairs' word links,
    {split}.align_offsets.npy  (L, 2) int32 and (N + 1,) int64 (see data/alignments.py)

Opening checks every file's size against the manifest, and the tokenizer against its recorded
digest; the files' sha256 are checked at once (``verify="now"``) or in a background thread
(``"background"``: training starts without reading a WMT-size directory through first, and
:meth:`PreparedData.verified` waits for the result before anything is saved). A truncated,
tampered or foreign file is a one-line :class:`DataError`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import mmap
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from transduce.checksums import sha256_file
from transduce.config import TASKS
from transduce.data.alignments import LINKS, PairLinks
from transduce.data.corpus import EncodedChunk, FilterStats
from transduce.data.tokenizer import Tokenizer, load_tokenizer
from transduce.errors import DataError

if TYPE_CHECKING:
    from transduce.data.batch import Batch, Specials

logger = logging.getLogger(__name__)

FORMAT = "transduce.prepared"
VERSION = 1
MANIFEST = "manifest.json"
TOKENIZER_DIR = "tokenizer"
SPLITS = ("train", "valid", "test")
SIDES = ("src", "tgt")


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned type that holds every id of a vocabulary."""
    return np.dtype("<u2" if vocab_size <= 1 << 16 else "<u4")


def length_dtype(max_len: int) -> np.dtype:
    """Lengths up to ``max_len``; one below the type's top, so that ``length + 1`` still fits."""
    return np.dtype("<u2" if max_len < (1 << 16) - 1 else "<u4")


# ---- writing ----------------------------------------------------------------------------------

class _HashedFile:
    """A binary file being written, with its sha256 and size kept as it grows."""

    def __init__(self, path: Path):
        self.path, self.handle, self.hash, self.size = path, open(path, "wb"), hashlib.sha256(), 0

    def write(self, data: bytes | memoryview) -> None:
        self.handle.write(data)
        self.hash.update(data)
        self.size += len(data)

    def close(self) -> dict[str, Any]:
        self.handle.flush()
        os.fsync(self.handle.fileno())
        self.handle.close()
        return {"size": self.size, "sha256": self.hash.hexdigest()}


class SplitWriter:
    """Appends encoded chunks of one split to its files in ``directory``; :meth:`close` indexes them.

    ``texts``: None (no text), ``"all"`` (every pair read, for validation BLEU) or ``"kept"``
    (the kept pairs, aligned with the ids, for BPE-dropout).
    """

    def __init__(self, directory: Path, split: str, dtype: np.dtype, len_dtype: np.dtype, texts: str | None):
        self.directory, self.split, self.dtype, self.len_dtype, self.texts = directory, split, dtype, len_dtype, texts
        self.tokens = {side: _HashedFile(directory / f"{split}.{side}.bin") for side in SIDES}
        self.text = {side: _HashedFile(directory / f"{split}.text.{side}") for side in SIDES} if texts else {}
        self.lengths: list[np.ndarray] = []   # (n, 2) per chunk
        self.text_lengths: list[np.ndarray] = []
        self.stats = FilterStats()

    def add(self, chunk: EncodedChunk) -> None:
        for side, flat in zip(SIDES, (chunk.src_tokens, chunk.tgt_tokens)):
            self.tokens[side].write(flat.astype(self.dtype, copy=False).tobytes())
        self.lengths.append(np.stack([chunk.src_lens, chunk.tgt_lens], axis=1).astype(self.len_dtype))
        for k in ("kept", "empty", "too_long", "bad_ratio"):
            setattr(self.stats, k, getattr(self.stats, k) + getattr(chunk.stats, k))
        if self.texts:
            if chunk.texts is None:
                raise ValueError("this split keeps text: encode its chunks with want_texts=True")
            pairs = [p for p, k in zip(chunk.texts, chunk.kept) if k] if self.texts == "kept" else chunk.texts
            sizes = []
            for k, side in enumerate(SIDES):
                lines = [p[k].encode("utf-8") + b"\n" for p in pairs]
                self.text[side].write(b"".join(lines))
                sizes.append(np.fromiter(map(len, lines), dtype=np.int64, count=len(lines)))
            self.text_lengths.append(np.stack(sizes, axis=1).reshape(-1, 2))

    def close(self) -> dict[str, Any]:
        """Write the index files; the split's manifest entry (counts and files)."""
        files = {f.path.name: f.close() for f in self.tokens.values()}
        lengths = np.concatenate(self.lengths) if self.lengths else np.zeros((0, 2), self.len_dtype)
        files.update(self._save(f"{self.split}.lengths.npy", lengths))
        files.update(self._save(f"{self.split}.offsets.npy", _offsets(lengths)))
        entry: dict[str, Any] = {"pairs": int(lengths.shape[0]), "filter": vars(self.stats).copy(),
                                 "src_tokens": int(lengths[:, 0].sum()), "tgt_tokens": int(lengths[:, 1].sum()),
                                 "text": self.texts}
        if self.texts:
            files.update({f.path.name: f.close() for f in self.text.values()})
            sizes = np.concatenate(self.text_lengths) if self.text_lengths else np.zeros((0, 2), np.int64)
            files.update(self._save(f"{self.split}.text.npy", _offsets(sizes)))
            entry["text_lines"] = int(sizes.shape[0])
        entry["files"] = files
        return entry

    def _save(self, name: str, array: np.ndarray) -> dict[str, Any]:
        path = self.directory / name
        with open(path, "wb") as f:
            np.save(f, array, allow_pickle=False)
            f.flush()
            os.fsync(f.fileno())
        return {name: {"size": path.stat().st_size, "sha256": sha256_file(path)}}


def _offsets(lengths: np.ndarray) -> np.ndarray:
    """(N, 2) lengths -> (N + 1, 2) int64 start offsets (the last row: the totals)."""
    out = np.zeros((lengths.shape[0] + 1, 2), dtype=np.int64)
    np.cumsum(lengths, axis=0, dtype=np.int64, out=out[1:])
    return out


# ---- reading ----------------------------------------------------------------------------------

class _Mapped:
    """A read-only memory map of a file (or of an empty one), viewed as a numpy array.

    :meth:`release` gives the mapped pages back: the page cache keeps them, but they stop
    counting in this process's resident memory, which would otherwise grow with every page of
    a large corpus that training has touched.
    """

    def __init__(self, path: Path, dtype: np.dtype, offset: int = 0, shape: tuple[int, ...] | None = None):
        self.map = None
        size = path.stat().st_size
        if size > offset:
            with open(path, "rb") as f:
                self.map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            array = np.frombuffer(self.map, dtype=dtype, offset=offset)
        else:
            array = np.zeros(0, dtype=dtype)
        self.array = array.reshape(shape) if shape is not None else array

    def release(self) -> None:
        if self.map is not None and hasattr(mmap, "MADV_DONTNEED"):
            self.map.madvise(mmap.MADV_DONTNEED)


def _map_npy(path: Path) -> _Mapped:
    """Memory-map a ``.npy`` file written by :meth:`SplitWriter._save`."""
    with open(path, "rb") as f:
        try:
            version = np.lib.format.read_magic(f)
            read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                           else np.lib.format.read_array_header_2_0)
            shape, fortran, dtype = read_header(f)
        except (ValueError, OSError) as err:
            raise DataError(f"{path}: not a numpy array file ({err})") from None
        offset = f.tell()
    if fortran or dtype.hasobject:
        raise DataError(f"{path}: unexpected array layout")
    return _Mapped(path, dtype, offset, shape)


class TokenPairs:
    """The pairs of one split: lengths in memory, ids read on demand (memory-mapped, or in memory).

    Shape:
        src_lens, tgt_lens: (N,) raw token counts (no BOS/EOS).
    """

    def __init__(self, tokens: tuple[np.ndarray, np.ndarray], offsets: np.ndarray, lengths: np.ndarray,
                 maps: Sequence[_Mapped] = ()):
        self.tokens, self.offsets, self.lengths, self._maps = tokens, offsets, lengths, list(maps)
        self.src_lens, self.tgt_lens = lengths[:, 0], lengths[:, 1]

    @classmethod
    def open(cls, root: Path, split: str, dtype: np.dtype) -> "TokenPairs":
        maps = [_Mapped(root / f"{split}.{side}.bin", dtype) for side in SIDES]
        offsets = _map_npy(root / f"{split}.offsets.npy")
        lengths = np.load(root / f"{split}.lengths.npy", allow_pickle=False)  # small: kept in memory
        return cls((maps[0].array, maps[1].array), offsets.array, lengths, [*maps, offsets])

    @classmethod
    def from_rows(cls, src_rows: Sequence[Sequence[int]], tgt_rows: Sequence[Sequence[int]], dtype: np.dtype,
                  len_dtype: np.dtype) -> "TokenPairs":
        """Pairs held in memory (e.g. one epoch's BPE-dropout segmentation)."""
        lengths = np.stack([np.fromiter(map(len, rows), np.int64, len(rows)) for rows in (src_rows, tgt_rows)],
                           axis=1).reshape(-1, 2)
        tokens = tuple(np.fromiter((t for row in rows for t in row), dtype, int(lengths[:, k].sum()))
                       for k, rows in enumerate((src_rows, tgt_rows)))
        return cls(tokens, _offsets(lengths), lengths.astype(len_dtype))

    def __len__(self) -> int:
        return self.lengths.shape[0]

    def head(self, n: int | None) -> "TokenPairs":
        """The first ``n`` pairs (all when ``n`` is None), sharing this one's files."""
        if n is None or n >= len(self):
            return self
        return TokenPairs(self.tokens, self.offsets[:n + 1], self.lengths[:n], self._maps)

    def pair(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Pair ``i``'s source and target ids."""
        lo, hi = self.offsets[i], self.offsets[i + 1]
        return self.tokens[0][lo[0]:hi[0]], self.tokens[1][lo[1]:hi[1]]

    def task_lengths(self, task: str) -> tuple[np.ndarray, np.ndarray]:
        """The (source, target) lengths that size a ``train.task``'s batches: an LM reads only the
        target side, a masked LM, a classifier or span corruption only the source side (a span
        batch's target is shorter than its input), translation both."""
        lens = {"src": self.src_lens, "tgt": self.tgt_lens}
        return lens[TASKS[task].lengths[0]], lens[TASKS[task].lengths[1]]

    def rows(self, side: int, indices: Sequence[int]) -> list[np.ndarray]:
        return [self.tokens[side][self.offsets[i, side]:self.offsets[i + 1, side]] for i in indices]

    def batch(self, indices: Sequence[int], specials: "Specials | None" = None,
              guide: "tuple[PairLinks, tuple[np.ndarray, np.ndarray]] | None" = None) -> "Batch":
        """The padded model batch of pairs ``indices`` with ``specials``' ids (the model's; None:
        transduce's fixed ones; see :func:`transduce.data.batch.collate`); with ``guide`` (the
        split's links and the sides' word starts) its guided alignment reference too."""
        from transduce.data.batch import DEFAULT_SPECIALS, collate  # lazy: start-up (torch: not for preparing data)
        links = None if guide is None else [guide[0][int(i)] for i in indices]
        return collate([self.pair(int(i)) for i in indices], specials or DEFAULT_SPECIALS, links,
                       None if guide is None else guide[1])

    def release(self) -> None:
        """Drop the mapped pages this process has touched (see :class:`_Mapped`)."""
        for m in self._maps:
            m.release()


class TextLines:
    """One split's text, one line per pair, read through a byte-offset index on disk."""

    def __init__(self, root: Path, split: str):
        self._maps = [_Mapped(root / f"{split}.text.{side}", np.dtype("u1")) for side in SIDES]
        self._offsets = _map_npy(root / f"{split}.text.npy")

    def __len__(self) -> int:
        return self._offsets.array.shape[0] - 1

    def side(self, k: int, start: int, stop: int) -> list[str]:
        """Lines ``start:stop`` of side ``k`` (0 source, 1 target)."""
        off, data = self._offsets.array, self._maps[k].array
        return [data[off[i, k]:off[i + 1, k] - 1].tobytes().decode("utf-8") for i in range(start, min(stop, len(self)))]

    def pairs(self, start: int = 0, stop: int | None = None) -> list[tuple[str, str]]:
        stop = len(self) if stop is None else stop
        return list(zip(self.side(0, start, stop), self.side(1, start, stop)))

    def release(self) -> None:
        for m in (*self._maps, self._offsets):
            m.release()


@dataclass
class PreparedData:
    """An opened prepared dataset (see the module docstring)."""

    root: Path
    manifest: dict[str, Any]
    tokenizer: Tokenizer
    _check: "_Verifier | None" = field(default=None, repr=False)

    @classmethod
    def open(cls, root: str | os.PathLike, verify: str = "now") -> "PreparedData":
        """Open ``root``, checking the manifest, every file's size, and the tokenizer; the files'
        sha256 now (``verify="now"``) or in a background thread (``"background"``, see :meth:`verified`)."""
        if verify not in ("now", "background"):
            raise ValueError(f"verify: 'now' or 'background', not {verify!r}")
        root = Path(root)
        manifest = read_manifest(root)
        files = [(root / name, want) for entry in manifest["splits"].values() for name, want in entry["files"].items()]
        for path, want in files:
            _check_size(path, want)
        tokenizer = load_tokenizer(root / TOKENIZER_DIR)
        if tokenizer.digest() != manifest["tokenizer"]["digest"]:
            raise DataError(f"{root / TOKENIZER_DIR}: this tokenizer is not the one the ids in {root} were "
                            "made with (its digest differs from the manifest's)")
        check = _Verifier(files)
        if verify == "now":
            check.run()
            check.raise_if_bad()
            return cls(root, manifest, tokenizer)
        check.thread.start()
        return cls(root, manifest, tokenizer, check)

    def verified(self) -> None:
        """Wait for the background sha256 check to end (at once if it has); DataError if a file failed."""
        if self._check is not None:
            self._check.thread.join()
            self._check.raise_if_bad()

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.manifest["dtype"])

    @property
    def max_len(self) -> int:
        return int(self.manifest["data"]["max_len"])

    @property
    def labels(self) -> tuple[str, ...]:
        """A classification set's classes in id order (each example's target is its label id); () for text pairs."""
        return tuple(self.manifest.get("labels", ()))

    @property
    def segments(self) -> int:
        """A classification set's texts per example: 1, or 2 for sentence pairs (``a EOS b``)."""
        return int(self.manifest.get("segments", 1))

    def split(self, name: str) -> TokenPairs:
        return TokenPairs.open(self.root, name, self.dtype)

    def has_alignments(self, name: str) -> bool:
        """Whether the split was prepared with word alignments (``data.train_alignments``)."""
        return f"{name}.{LINKS}" in self.manifest["splits"][name]["files"]

    def alignments(self, name: str) -> PairLinks:
        """The split's word links by pair (see :mod:`transduce.data.alignments`)."""
        if not self.has_alignments(name):
            raise DataError(f"{self.root}: the {name} split was prepared without alignments (data.train_alignments)")
        return PairLinks(self.root, name)

    def has_text(self, name: str) -> bool:
        return bool(self.manifest["splits"][name]["text"])

    def text(self, name: str) -> TextLines:
        if not self.has_text(name):
            raise DataError(f"{self.root}: the {name} split was prepared without its text "
                            "(train text is kept when data.bpe_dropout > 0 at prepare time)")
        return TextLines(self.root, name)

    def texts(self, name: str) -> list[tuple[str, str]]:
        """Every text pair of a (small) split, e.g. validation sources and references."""
        return self.text(name).pairs() if self.has_text(name) else []


def read_manifest(root: Path) -> dict[str, Any]:
    path = root / MANIFEST
    if not root.is_dir():
        raise DataError(f"{root}: no such prepared data directory (make one with: transduce prepare CONFIG --out DIR)")
    if not path.is_file():
        raise DataError(f"{root}: not a prepared data directory (no {MANIFEST}; an interrupted prepare leaves none)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DataError(f"{path}: unreadable manifest ({err})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise DataError(f"{path}: not a transduce prepared-data manifest")
    if manifest.get("version") != VERSION:
        raise DataError(f"{path}: prepared-data version {manifest.get('version')!r}; this transduce reads "
                        f"version {VERSION} (prepare the data again)")
    return manifest


class _Verifier:
    """The sha256 of a prepared directory's files against its manifest, in this or a daemon thread
    (hashlib reads without holding the GIL: training goes on meanwhile)."""

    def __init__(self, files: list[tuple[Path, dict[str, Any]]]):
        self.files, self.error = files, None
        self.thread = threading.Thread(target=self.run, name="prepared-sha256", daemon=True)

    def run(self) -> None:
        for path, want in self.files:
            if sha256_file(path) != want["sha256"]:
                self.error = DataError(f"{path}: contents differ from the manifest's sha256 (modified after "
                                       "prepare; prepare the data again)")
                return

    def raise_if_bad(self) -> None:
        if self.error is not None:
            raise self.error


def _check_size(path: Path, want: dict[str, Any]) -> None:
    if not path.is_file():
        raise DataError(f"{path}: missing from the prepared data")
    size = path.stat().st_size
    if size != want["size"]:
        raise DataError(f"{path}: {size:,} bytes but the manifest says {want['size']:,} (truncated or replaced; "
                        "prepare the data again)")
