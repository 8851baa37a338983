"""Encoding a split's chunks of raw lines, in worker processes or in this one (``transduce prepare``,
:mod:`transduce.data.prepare`): decode, encode, filter (:func:`~transduce.data.corpus.encode_chunk`),
and hand each chunk to a writer in input order.
"""

from __future__ import annotations

import multiprocessing
from collections import deque
from itertools import chain, islice
from typing import TYPE_CHECKING, Any, Iterator

from transduce.config import DataConfig
from transduce.data.corpus import EncodedChunk, encode_chunk
from transduce.data.tokenizer import Tokenizer
from transduce.errors import DataError
from transduce.progress import progress_bar

if TYPE_CHECKING:
    from transduce.data.prepare import SplitSource
    from transduce.data.prepared import SplitWriter

_WORKER: dict[str, Any] = {}


def _init_worker(tokenizer: Tokenizer, max_len: int, max_ratio: float, dtype: str) -> None:
    _WORKER.update(tokenizer=tokenizer, max_len=max_len, max_ratio=max_ratio, dtype=dtype)


def _work(src: list[bytes], tgt: list[bytes], first: int, names: tuple[str, str], texts: bool) -> EncodedChunk:
    w = _WORKER
    return encode_chunk(src, tgt, first, names, w["tokenizer"], w["max_len"], w["max_ratio"], w["dtype"], texts)


def _numbered(chunks: Iterator[tuple[list[bytes], list[bytes]]]) -> Iterator[tuple[list[bytes], list[bytes], int]]:
    """Each chunk with the line number of its first line."""
    first = 1
    for src, tgt in chunks:
        yield src, tgt, first
        first += len(src)


class Encoder:
    """Encodes chunks in ``workers`` spawned processes (started at the first split big enough to
    need them), or in this process; results are written in input order."""

    def __init__(self, tokenizer: Tokenizer, cfg: DataConfig, dtype: str, workers: int):
        self.tokenizer, self.cfg, self.dtype, self.workers = tokenizer, cfg, dtype, workers
        self.pool = None

    def __enter__(self) -> "Encoder":
        return self

    def __exit__(self, *exc) -> None:
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()

    def run(self, source: "SplitSource", writer: "SplitWriter", texts: bool) -> None:
        with progress_bar(None, unit="sentences", desc="encoding") as bar:  # lines read so far, rate

            def add(chunk) -> None:
                writer.add(chunk)
                bar.update(len(chunk.kept))

            self._run(source, add, texts)

    def _run(self, source: "SplitSource", add, texts: bool) -> None:
        chunks = _numbered(source.raw_chunks())
        head = list(islice(chunks, 2))
        if self.workers <= 1 or len(head) < 2:  # one chunk: not worth starting processes
            for src, tgt, first in chain(head, chunks):
                add(encode_chunk(src, tgt, first, source.names, self.tokenizer, self.cfg.max_len,
                                 self.cfg.ratio_limit, self.dtype, texts, threads=max(self.workers, 1)))
            return
        pool = self._pool()
        pending: deque = deque()
        try:
            for src, tgt, first in chain(head, chunks):
                pending.append(pool.apply_async(_work, (src, tgt, first, source.names, texts)))
                while len(pending) > 2 * self.workers:  # bounded: the corpus is never all in flight
                    add(pending.popleft().get())
        except DataError:  # reading failed (misaligned files, corrupt gzip): errors of earlier lines first
            while pending:
                pending.popleft().get()
            raise
        while pending:
            add(pending.popleft().get())

    def _pool(self):
        if self.pool is None:
            ctx = multiprocessing.get_context("spawn")  # no fork of a process that may hold threads
            self.pool = ctx.Pool(self.workers, _init_worker,
                                 (self.tokenizer, self.cfg.max_len, self.cfg.ratio_limit, self.dtype))
        return self.pool
