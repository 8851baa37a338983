"""Line-oriented I/O for ``transduce translate``: one line in, one line (or K lines) out.

Input is strict UTF-8 read from a file or stdin; lines are split on ``\\n`` only (``\\r\\n``
accepted), so the output always has as many lines as the input (times ``nbest``). A file
output is written to a temporary file next to it and renamed at the end, so a crash never
leaves a half-written translation behind.

n-best format (``nbest > 1``): K lines per input line, best first, each ``SCORE<TAB>TEXT``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, IO, Iterable, Iterator, TextIO


from ..atomic import atomic_path
from ..config import DecodeConfig
from ..data.corpus import decode_line, read_lines
from ..errors import ConfigError, DataError
from ..progress import progress_bar
from .text.alignment import format_alignment, forced_details, restore_all, strip_sources
from .scoring import format_scored, score_pairs, translation_json
from .text.terms import Terms
from .translator import Translation, Translator

if TYPE_CHECKING:
    from tqdm import tqdm

logger = logging.getLogger(__name__)


def iter_lines(path: str | os.PathLike | None, stdin: IO | None = None) -> Iterator[str]:
    """Lines of ``path`` (plain or gzip), or of standard input when ``path`` is None or "-".

    A missing file is reported here, before anything is read or written.
    """
    if path is None or str(path) == "-":
        stream = stdin if stdin is not None else sys.stdin
        return _decode_all(getattr(stream, "buffer", stream), "<stdin>")
    return read_lines(path)


def _decode_all(lines: Iterable[bytes | str], name: str) -> Iterator[str]:
    for lineno, raw in enumerate(lines, start=1):
        yield decode_line(raw.encode("utf-8") if isinstance(raw, str) else raw, name, lineno)


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike | None, stdout: TextIO | None = None) -> Iterator[TextIO]:
    """A text stream for ``path`` that appears only when the block succeeds; stdout for None/"-"."""
    if path is None or str(path) == "-":
        yield stdout if stdout is not None else sys.stdout
        return
    path = Path(path)
    if not path.parent.is_dir():
        raise DataError(f"{path}: output directory does not exist")
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as handle:
        yield handle


@contextlib.contextmanager
def reporting(translator, total: int | None, enabled: bool = True) -> Iterator[tqdm]:
    """A bar of ``total`` sentences (standard error, see :mod:`transduce.progress`) that
    ``translator``'s batches advance for the block; ``enabled`` False: none."""
    with progress_bar(total, unit="sentences", desc="translating", enabled=enabled) as bar:
        translator.progress = bar
        try:
            yield bar
        finally:
            translator.progress = None


def read_texts(path: str | os.PathLike | None) -> list[tuple[str, ...]]:
    """The texts of a file (or stdin) for a classifier: one text, or ``text_a<TAB>text_b`` (a
    sentence pair), a line; a one-line DataError naming the line for more fields."""
    texts = []
    for n, line in enumerate(iter_lines(path), 1):
        fields = tuple(line.split("\t"))
        if len(fields) > 2:
            raise DataError(f"{path or '<stdin>'}:{n}: expected a text or text_a<TAB>text_b; got {len(fields)} fields")
        texts.append(fields)
    return texts


def one_line(text: str) -> str:
    """Keep the one-line-per-input contract even if a detokenizer produced a line break."""
    return " ".join(text.splitlines()) if ("\n" in text or "\r" in text) else text


def format_translation(t: Translation, nbest: int) -> list[str]:
    """The output lines of one input: its text, or ``nbest`` lines ``SCORE<TAB>TEXT``."""
    if nbest == 1:
        return [one_line(t.best.text)]
    hyps = t.hypotheses[:nbest]
    hyps = hyps + [hyps[-1]] * (nbest - len(hyps))  # always exactly nbest lines
    return [f"{h.score:.6f}\t{one_line(h.text)}" for h in hyps]


def _chunks(lines: Iterable[str], size: int) -> Iterator[list[str]]:
    chunk: list[str] = []
    for line in lines:
        chunk.append(line)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def translate_file(
    translator: Translator, input_path: str | os.PathLike | None, output_path: str | os.PathLike | None,
    decode: DecodeConfig | None = None, chunk_lines: int = 2000, stdin: IO | None = None,
    stdout: TextIO | None = None, prefix_path: str | os.PathLike | None = None, terms: Terms = Terms(),
    output_format: str = "text", markup: bool = False, **overrides,
) -> int:
    """Translate a file (or stdin) line by line into a file (or stdout) with ``decode`` (default:
    the translator's settings) and ``overrides`` of its fields (``nbest=4`` writes the 4 best as
    ``SCORE<TAB>TEXT`` lines; with ``rerank`` the n-best are the pool it chooses from, and only
    its choice is written); returns lines read. ``prefix_path``: a file aligned with the input
    whose lines each translation must begin with (an empty line: no prefix). ``terms``: where
    each line's constraints come from (:class:`~transduce.inference.text.terms.Terms`: the line's own
    TAB-separated phrases, a glossary). ``output_format`` ``jsonl``: a JSON object per input
    line instead (:func:`~transduce.inference.scoring.translation_json`: per-token log-probabilities,
    by forced decoding of the outputs (where the searches run), and the word alignment of
    :mod:`~transduce.inference.text.alignment`). ``markup``: each line's tags and placeholders are
    taken out before translation and put back at aligned positions (:mod:`~transduce.inference.text.markup`;
    one translation per line; with ``jsonl`` the alignment is that of the text without them).

    Lines are processed in chunks of ``chunk_lines`` (sorted by length inside a chunk), so
    standard output streams and memory stays bounded.
    """
    decode = translator.settings(decode, **overrides)
    if markup and decode.nbest > 1 and decode.rerank == "none":
        raise ConfigError(f"markup: puts tags back into one translation per line; got decode.nbest={decode.nbest}")
    n = 0
    lines = iter_lines(input_path, stdin)
    prefixes = None if prefix_path is None else iter(read_lines(prefix_path))
    total = None if input_path is None or str(input_path) == "-" else sum(1 for _ in read_lines(input_path))
    with atomic_output(output_path, stdout) as out, \
            reporting(translator, total, enabled=not out.isatty()) as bar:  # not between translations on screen
        for chunk in _chunks(lines, chunk_lines):
            prefix = None if prefixes is None else [next(prefixes, None) for _ in chunk]
            if prefix is not None and None in prefix:
                raise DataError(f"{prefix_path}: has fewer lines than the input ({n + prefix.index(None)})")
            sources, constraints = terms.split(chunk)
            stripped = strip_sources(translator, sources) if markup else None
            results = translator.translate_detailed(sources if stripped is None else [s.text for s in stripped],
                                                    decode, prefix=prefix, constraints=constraints,
                                                    scores=output_format != "text" or decode.nbest > 1)
            lines_out = _output_lines(translator, results, decode, output_format, stripped)
            out.write("".join(line + "\n" for line in lines_out))
            out.flush()
            n += len(chunk)
            bar.update(n - bar.n)  # empty lines are not searched: count them too
            logger.info("translated %d lines", n)
        if prefixes is not None and next(prefixes, None) is not None:
            raise DataError(f"{prefix_path}: has more lines than the input ({n})")
    return n


def _output_lines(translator, results: list[Translation], decode: DecodeConfig, output_format: str,
                  stripped: list | None = None) -> list[str]:
    """The output lines of a chunk's translations in ``output_format`` (text or jsonl), with the
    ``stripped`` sources' markup put back when given."""
    if output_format == "jsonl" or stripped is not None:
        log_probs, links = forced_details(translator, results, decode, alignment=True)
        if stripped is not None:
            restore_all(results, stripped, links)
        if output_format == "jsonl":
            return [one_line(translation_json(t, lp, format_alignment(a)))
                    for t, lp, a in zip(results, log_probs, links)]
    shown = 1 if decode.rerank != "none" else decode.nbest  # reranking: the n-best are the pool, one answer
    return [line for t in results for line in format_translation(t, shown)]


def score_files(translator, src_path: str | os.PathLike, tgt_path: str | os.PathLike,
                output_path: str | os.PathLike | None, output_format: str = "text",
                decode: DecodeConfig | None = None) -> int:
    """Score the aligned lines of two files into a file (or stdout); returns the pairs scored. A
    one-line DataError when the files differ in length."""
    decode = decode or translator.decode
    sources, targets = list(read_lines(src_path)), list(read_lines(tgt_path))
    if len(sources) != len(targets):
        raise DataError(f"{tgt_path}: has {len(targets)} lines, {src_path} has {len(sources)} (one target per source)")
    with atomic_output(output_path) as out, reporting(translator, len(sources), enabled=not out.isatty()):
        scored = score_pairs(translator, sources, targets, decode)
        out.write("".join(one_line(format_scored(s, output_format)) + "\n" for s in scored))
    return len(scored)
