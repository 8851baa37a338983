"""Document translation: paragraphs of any length in, the same paragraphs translated out.

A document is paragraphs separated by blank lines (empty or whitespace-only lines, kept
exactly). Each paragraph is split into sentences by ``sentencex`` (the ``documents`` extra,
imported lazily; ``docs/guides/documents-and-streaming.md`` says why it and not pysbd), a
sentence longer than the model's source limit is cut into pieces under it (at clause
punctuation, then whitespace, then, for a run with neither, between characters), and every
piece of the whole document goes to the translator in ONE call, so the search batches them by
length. Nothing is dropped or truncated: the pieces and the whitespace between them, joined,
give back the paragraph exactly (:meth:`Paragraph.source`), and the translations are joined
with that same whitespace. With ``markup``, each sentence's tags are kept as
``translate(markup=True)`` keeps a line's (:mod:`~transduce.inference.text.markup`); closing tags that
follow a sentence's end (``<b>It runs.</b> Next.``) belong to that sentence, not the next.

Examples:
    >>> translate_document(translator, "A dog runs. It sleeps.\\n\\nThe end.")  # doctest: +SKIP
    'Ein Hund läuft. Er schläft.\\n\\nDas Ende.'
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import IO, Callable, TextIO

from ..config import DecodeConfig
from ..data.multilingual import source_texts
from ..errors import ConfigError, require
from .files import atomic_output, iter_lines
from .text.markup import TOKEN
from .translator import input_limit

_BLANK = re.compile(r"^[ \t\f\v]*$")
# Where an over-long sentence may be cut, tried in order: after clause punctuation, at whitespace.
_CUTS = (re.compile(r"(?<=[,;:\u3001\uff0c])\s+"), re.compile(r"\s+"))


@dataclass
class Paragraph:
    """One paragraph: its leading whitespace, then pieces each followed by its whitespace.

    ``pieces[i] + gaps[i]`` in order, after ``lead``, is the paragraph's source text exactly.
    """

    lead: str
    pieces: list[str]
    gaps: list[str]

    def source(self) -> str:
        return self.lead + "".join(p + g for p, g in zip(self.pieces, self.gaps))

    def joined(self, translations: list[str]) -> str:
        """The translated paragraph: ``translations`` (one per piece) with the source's whitespace."""
        return self.lead + "".join(t + g for t, g in zip(translations, self.gaps))


def split_blocks(text: str) -> list[str | list[str]]:
    """The document's lines grouped: a paragraph is a list of its lines, a blank line a str."""
    blocks: list[str | list[str]] = []
    for line in text.split("\n"):
        if _BLANK.match(line):
            blocks.append(line)
        elif blocks and isinstance(blocks[-1], list):
            blocks[-1].append(line)
        else:
            blocks.append([line])
    return blocks


def split_sentences(text: str, language: str = "en") -> list[str]:
    """``text`` cut into sentences by sentencex, each with the whitespace after it (joined, they
    are ``text`` exactly); ``language`` an ISO 639 code (unknown codes fall back to its
    language families, then English)."""
    sentencex = require("sentencex", "documents", "document translation")
    sentences = [s for s in sentencex.segment(language, text) if s]
    if "".join(sentences) != text:  # sentencex keeps every character; never lose one if that changes
        return [text]
    return _closing_tags_back(sentences)


def _closing_tags_back(sentences: list[str]) -> list[str]:
    """``sentences`` with the closing tags (and the whitespace after them) that begin one moved
    to the end of the sentence before: sentencex cuts right after the full stop, so
    ``<b>It runs.</b> Next.`` would give ``</b>`` (and the space) to the next sentence."""
    out: list[str] = []
    for sentence in sentences:
        end = 0
        while out and (m := TOKEN.match(sentence, end)) and m.group(1):  # </name>
            end = len(sentence) - len(sentence[m.end():].lstrip())
        if end:
            out[-1] += sentence[:end]
        if sentence[end:]:
            out.append(sentence[end:])
    return out


def fit(text: str, limit: int, count: Callable[[str], int], level: int = 0) -> list[str]:
    """``text`` (no surrounding whitespace) cut into pieces of at most ``limit`` tokens
    (``count``), each with the whitespace that followed it: at clause punctuation, then at
    whitespace, then between characters. Joined, the pieces are ``text`` exactly."""
    if count(text) <= limit:
        return [text]
    if level == len(_CUTS):
        return _pack(list(text), limit, count)
    units, start = [], 0
    for m in _CUTS[level].finditer(text):
        units.append(text[start:m.end()])
        start = m.end()
    units.append(text[start:])
    out: list[str] = []
    for unit in _pack(units, limit, count):
        body = unit.rstrip()
        if count(body) <= limit:
            out.append(unit)
            continue
        parts = fit(body, limit, count, level + 1)  # one unit alone is over the limit: cut finer
        parts[-1] += unit[len(body):]
        out.extend(parts)
    return out


def _pack(units: list[str], limit: int, count: Callable[[str], int]) -> list[str]:
    """Consecutive ``units`` merged greedily while the merged text stays within ``limit``."""
    out: list[str] = []
    for unit in units:
        if out and count((out[-1] + unit).strip()) <= limit:
            out[-1] += unit
        else:
            out.append(unit)
    return out


def split_paragraph(lines: list[str], language: str, limit: int, count: Callable[[str], int]) -> Paragraph:
    """A paragraph's lines as sentences (pieces under ``limit`` tokens) and the whitespace around them."""
    text = "\n".join(lines)
    body = text.lstrip()
    para = Paragraph(text[: len(text) - len(body)], [], [])
    for sentence in split_sentences(body, language):
        core = sentence.rstrip()
        for k, piece in enumerate(pieces := fit(core, limit, count)):
            stripped = piece.rstrip()
            gap = piece[len(stripped):] + (sentence[len(core):] if k == len(pieces) - 1 else "")
            para.pieces.append(stripped)
            para.gaps.append(gap)
    return para


def translate_document(translator, text: str, decode: DecodeConfig | None = None, language: str = "en",
                       markup: bool = False, **overrides) -> str:
    """Translate a document (see the module doc) with ``decode`` (default: the translator's
    settings) and ``overrides`` of its fields; blank lines, paragraph breaks and the whitespace
    between sentences are kept. An empty document gives an empty one. A multilingual model's
    ``tgt_lang`` tags every sentence (and counts in its length). ``markup``: each sentence's tags
    and placeholders are kept (``translator.translate(..., markup=True)``)."""
    decode = translator.settings(decode, **overrides)
    limit = input_limit(translator.config, decode.max_input_len)

    def count(piece: str) -> int:  # as the model sees it: a multilingual model's tag (or language code) included
        [tagged], lead, _ = source_texts([piece], decode, translator.tokenizer)
        return len(lead) + len(translator.tokenizer.encode(tagged, side="src"))

    blocks = split_blocks(text)
    paragraphs = [split_paragraph(b, language, limit, count) for b in blocks if isinstance(b, list)]
    sources = [p for para in paragraphs for p in para.pieces]
    translations = iter(translator.translate(sources, decode, markup=markup))  # one call: batched by length
    translated = iter([para.joined([next(translations) for _ in para.pieces]) for para in paragraphs])
    return "\n".join(next(translated) if isinstance(b, list) else b for b in blocks)


def translate_document_file(translator, input_path: str | os.PathLike | None, output_path: str | os.PathLike | None,
                            language: str = "en", decode: DecodeConfig | None = None, stdin: IO | None = None,
                            stdout: TextIO | None = None, markup: bool = False, **overrides) -> int:
    """Translate a document file (or stdin) into a file (or stdout, written atomically); returns
    the paragraphs translated. Lines end in ``\\n`` on output (``\\r\\n`` is read as ``\\n``).
    ``markup``: tags kept, as in :func:`translate_document`."""
    if not language or not language.replace("-", "").replace("_", "").isalnum():
        raise ConfigError(f"language: an ISO 639 code such as en or de; got {language!r}")
    lines = list(iter_lines(input_path, stdin))
    if not lines:  # an empty document: an empty translation
        with atomic_output(output_path, stdout):
            return 0
    text = "\n".join(lines)
    result = translate_document(translator, text, decode, language, markup, **overrides)
    with atomic_output(output_path, stdout) as out:
        out.write(result + "\n")
    return sum(isinstance(b, list) for b in split_blocks(text))
