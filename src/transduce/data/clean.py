"""Cleaning a parallel corpus: ``transduce clean SRC TGT --out DIR``, and ``data.clean`` on the way
into ``prepare``/``train``.

One streaming pass over two aligned files (plain or gzip) in chunks: each chunk is decoded and
judged by the per-pair rules (:mod:`transduce.data.clean_rules`) in worker processes, then, in
order in this process, by the duplicate rules against a memory of fixed size
(:mod:`transduce.data.dedup`). Memory does not grow with the corpus: a few chunks in flight and
the duplicate memory (``data.clean.dedup_memory_mb``).

``clean`` writes ``DIR/kept.SRC_LANG`` and ``DIR/kept.TGT_LANG`` (the kept pairs, in order),
``DIR/removed.jsonl`` (each dropped pair: its line number, the rule that dropped it, its text) and
``DIR/summary.json`` (counts per rule), into a temporary directory renamed to ``DIR`` when
complete: an error or an interruption leaves no ``DIR``.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from itertools import chain, islice
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np

from transduce.atomic import atomic_dir
from transduce.config.clean import CleanConfig, check_language, clean_settings
from transduce.data.clean_rules import RULES, Judge, judge_chunk
from transduce.data.corpus import decode_lines, read_parallel_chunks
from transduce.data.dedup import KeyMemory
from transduce.errors import DataError
from transduce.progress import progress_bar

CHUNK = 20_000  # pairs judged at a time
RawChunk = tuple[list[bytes], list[bytes]]
_WORKER: dict[str, Any] = {}


@dataclass
class JudgedChunk:
    """A chunk's pairs (lines ``first``, ``first + 1``, ...) and the rule that drops each (None: kept)."""

    first: int
    pairs: list[tuple[str, str]]
    rules: list[str | None]


@dataclass
class CleanReport:
    """How many pairs were read and kept, and how many each rule dropped."""

    pairs: int = 0
    kept: int = 0
    removed: dict[str, int] = field(default_factory=lambda: dict.fromkeys(RULES, 0))
    seconds: float = 0.0
    dedup_forgets: int = 0

    def add(self, chunk: JudgedChunk) -> None:
        self.pairs += len(chunk.rules)
        for rule in chunk.rules:
            if rule is None:
                self.kept += 1
            else:
                self.removed[rule] += 1

    def summary(self) -> str:
        """One line, e.g. ``kept 950 of 1,000 pairs (duplicate 30, lang 20)``."""
        dropped = ", ".join(f"{rule} {n:,}" for rule, n in self.removed.items() if n)
        return f"kept {self.kept:,} of {self.pairs:,} pairs" + (f" ({dropped})" if dropped else "")

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["pairs_per_s"] = round(self.pairs / self.seconds) if self.seconds else None
        return out


def _decode_and_judge(src: list[bytes], tgt: list[bytes], first: int, names: tuple[str, str], judge: Judge):
    pairs = list(zip(decode_lines(src, names[0], first), decode_lines(tgt, names[1], first)))
    return first, pairs, *judge_chunk(pairs, judge)


def _init_worker(judge: Judge) -> None:
    _WORKER["judge"] = judge


def _work(src: list[bytes], tgt: list[bytes], first: int, names: tuple[str, str]):
    return _decode_and_judge(src, tgt, first, names, _WORKER["judge"])


class Cleaner:
    """Judges chunks of raw line pairs, in order, in ``workers`` processes (or this one), with one
    duplicate memory across every chunk it is given."""

    def __init__(self, cfg: CleanConfig, src_lang: str, tgt_lang: str, workers: int = 1):
        check_language(src_lang, "source language")
        check_language(tgt_lang, "target language")
        self.judge = Judge(cfg, src_lang, tgt_lang)
        self.workers = workers
        self.memory = KeyMemory(cfg.dedup_memory_mb) if cfg.on("duplicate") or cfg.on("near_duplicate") else None
        self.report = CleanReport()

    def run(self, chunks: Iterable[RawChunk], names: tuple[str, str]) -> Iterator[JudgedChunk]:
        """Every chunk judged (per-pair rules, then the duplicate ones), counted in :attr:`report`."""
        t0 = time.monotonic()
        for first, pairs, rules, keys, bands in self._judged(chunks, names):
            chunk = JudgedChunk(first, pairs, rules)
            self._deduplicate(chunk, keys, bands)
            self.report.add(chunk)
            self.report.seconds = round(time.monotonic() - t0, 3)
            yield chunk
        if self.memory is not None:
            self.report.dedup_forgets = self.memory.forgets

    def _judged(self, chunks: Iterable[RawChunk], names: tuple[str, str]) -> Iterator[tuple]:
        numbered = _numbered(chunks)
        head = list(islice(numbered, 2))
        if self.workers <= 1 or len(head) < 2:  # one chunk: not worth starting processes
            for src, tgt, first in chain(head, numbered):
                yield _decode_and_judge(src, tgt, first, names, self.judge)
            return
        ctx = multiprocessing.get_context("spawn")  # no fork of a process that may hold threads
        with ctx.Pool(self.workers, _init_worker, (self.judge,)) as pool:
            pending: deque = deque()
            try:
                for src, tgt, first in chain(head, numbered):
                    pending.append(pool.apply_async(_work, (src, tgt, first, names)))
                    while len(pending) > 2 * self.workers:  # bounded: the corpus is never all in flight
                        yield pending.popleft().get()
            except DataError:  # misaligned files: the lines both have come first, then the error
                while pending:
                    yield pending.popleft().get()
                raise
            while pending:
                yield pending.popleft().get()

    def _deduplicate(self, chunk: JudgedChunk, keys: np.ndarray, bands: np.ndarray) -> None:
        """Marks the pairs that passed every other rule and repeat an earlier one (in order)."""
        cfg, rules = self.judge.cfg, chunk.rules
        for name, table in (("duplicate", keys[:, None]), ("near_duplicate", bands)):
            if not cfg.on(name):
                continue
            alive = np.array([i for i, r in enumerate(rules) if r is None], np.int64)
            for i in alive[self.memory.seen(table[alive])]:
                rules[i] = name


def _numbered(chunks: Iterable[RawChunk]) -> Iterator[tuple[list[bytes], list[bytes], int]]:
    first = 1
    for src, tgt in chunks:
        yield src, tgt, first
        first += len(src)


# ---- transduce clean ---------------------------------------------------------------------------

def output_names(src_lang: str, tgt_lang: str) -> tuple[str, str]:
    """The kept pairs' file names in ``--out`` (``kept.src``/``kept.tgt`` when both codes are one)."""
    return (f"kept.{src_lang}", f"kept.{tgt_lang}") if src_lang != tgt_lang else ("kept.src", "kept.tgt")


def clean_files(src: str | os.PathLike, tgt: str | os.PathLike, out: str | os.PathLike, cfg: CleanConfig,
                src_lang: str, tgt_lang: str, workers: int = 1) -> CleanReport:
    """Clean the aligned files ``src`` and ``tgt`` (plain or gzip) into the new directory ``out``.

    Raises:
        DataError: ``out`` exists; misaligned files, invalid UTF-8 (naming file and line).
        ConfigError: an unknown language code.
    """
    out = Path(out)
    cleaner = Cleaner(cfg, src_lang, tgt_lang, workers)
    if out.exists():
        raise DataError(f"{out}: already exists; clean into a new directory (or remove this one)")
    chunks = read_parallel_chunks(src, tgt, CHUNK)
    with atomic_dir(out) as stage, progress_bar(None, unit="pairs", desc="cleaning") as bar:
        kept_names = output_names(src_lang, tgt_lang)
        with open(stage / kept_names[0], "w", encoding="utf-8") as kept_src, \
                open(stage / kept_names[1], "w", encoding="utf-8") as kept_tgt, \
                open(stage / "removed.jsonl", "w", encoding="utf-8") as removed:
            for chunk in cleaner.run(chunks, (str(src), str(tgt))):
                _write(chunk, kept_src, kept_tgt, removed)
                bar.update(len(chunk.rules))
        summary = {"src": str(src), "tgt": str(tgt), "src_lang": src_lang, "tgt_lang": tgt_lang,
                   **cleaner.report.to_dict(), "settings": asdict(cfg)}
        (stage / "summary.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    return cleaner.report


def _write(chunk: JudgedChunk, kept_src, kept_tgt, removed) -> None:
    kept = [p for p, r in zip(chunk.pairs, chunk.rules) if r is None]
    kept_src.write("".join(f"{s}\n" for s, _ in kept))
    kept_tgt.write("".join(f"{t}\n" for _, t in kept))
    removed.write("".join(json.dumps({"line": chunk.first + i, "rule": r, "src": p[0], "tgt": p[1]},
                                     ensure_ascii=False) + "\n"
                          for i, (p, r) in enumerate(zip(chunk.pairs, chunk.rules)) if r is not None))


# ---- data.clean in prepare -----------------------------------------------------------------------

def cleaner_for(clean: dict[str, Any], src_lang: str, tgt_lang: str) -> Cleaner:
    """The cleaner of a config's ``data.clean`` (``prepare`` and ``train``), in this process."""
    return Cleaner(clean_settings(clean), src_lang, tgt_lang, workers=1)


def kept_chunks(cleaner: Cleaner, chunks: Iterable[RawChunk], names: tuple[str, str]) -> Iterator[RawChunk]:
    """The pairs of ``chunks`` the cleaner keeps, as raw chunks again (for :mod:`transduce.data.prepare`)."""
    for chunk in cleaner.run(chunks, names):
        kept = [p for p, r in zip(chunk.pairs, chunk.rules) if r is None]
        if kept:
            yield [f"{s}\n".encode() for s, _ in kept], [f"{t}\n".encode() for _, t in kept]
