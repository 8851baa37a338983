"""Inline markup kept through translation: tags out before, back in at aligned positions after.

What counts as markup (a small regex tokenizer, no dependency): XML/HTML tags (``<b>``,
``</b>``, ``<a href="x">``, ``<br/>``), ``{name}`` placeholders and ``http(s)://`` URLs.
:func:`strip_markup` removes them, each standing as a word boundary, and records where they
stood between the source words; the plain text is translated; :func:`restore_markup` puts them
back into the translation with a word alignment (``(source word, target word)`` links, see
:mod:`~transduce.inference.text.alignment`):

- an element ``<b>...</b>`` wraps the target words aligned to the source words it wrapped
  (from the first to the last of them); nested elements stay inside it; elements side by side
  stay side by side, in the order of their target words;
- a standalone tag (``<br/>``, a placeholder, a URL) goes before the target word aligned to the
  source word it preceded (after the one aligned to the word before it, if that one has none);
- an element whose words have no aligned target word spans from where its first word would
  go to where the word after it would (possibly nothing: ``<b></b>``), so nothing is dropped.

Markup that is not well-formed (``</i>`` without ``<i>``, ``<b>`` never closed, tags crossing
as in ``<b><i></b></i>``): a tag that has no partner in nesting order is kept as a standalone
tag. The output always has the same tags, each once, in an order as well-formed as the
input's; a ``<`` that starts no tag (``a < b``) is text. Text without markup is returned as is.

A multilingual model's target-language tag (``<2de>``, :mod:`~transduce.data.multilingual`) first
on a line is neither markup nor a word of the text: given as ``lead``, it stays in front of the
plain text and word boundaries are counted after it (word alignments skip it too).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Collection, Sequence

TOKEN = re.compile(r"<(/?)([A-Za-z][\w:.-]*)(?:\s[^<>]*?)?(/?)>|\{[A-Za-z_][\w.]*\}|https?://[^\s<>]+")


@dataclass
class Element:
    """A tag pair (``close`` set) or a standalone tag, at source word boundary ``start``: it
    stands before source word ``start`` and a pair wraps the words up to ``end``."""

    open: str
    start: int
    close: str | None = None
    end: int = 0
    children: list["Element"] = field(default_factory=list)


@dataclass
class Stripped:
    """A text without its markup: ``text`` (words joined by single spaces), its ``n_words``,
    and the top-level :class:`Element` s (``elements``; empty: there was no markup)."""

    text: str
    n_words: int
    elements: list[Element]


def strip_markup(text: str, lead: Collection[str] = ()) -> Stripped:
    """Take the tags, placeholders and URLs out of ``text`` (see the module docstring); a first
    word in ``lead`` (a target-language tag) stays first in the plain text and counts as no word."""
    head, _, rest = text.partition(" ")  # as with_tag reads a tag
    if head in lead:
        body = strip_markup(rest)
        return Stripped(" ".join(filter(None, (head, body.text))), body.n_words, body.elements)
    words: list[str] = []
    root = Element("", 0)
    stack: list[tuple[Element, str]] = [(root, "")]  # open elements and their tag names
    pos = 0
    for m in TOKEN.finditer(text):
        words += text[pos:m.start()].split()
        pos = m.end()
        here, innermost = len(words), stack[-1][0]
        if m.group(2) and not m.group(1) and not m.group(3):          # <name ...>
            element = Element(m.group(0), here)
            innermost.children.append(element)
            stack.append((element, m.group(2)))
        elif m.group(1) and len(stack) > 1 and stack[-1][1] == m.group(2):  # its </name>
            innermost.close, innermost.end = m.group(0), here
            stack.pop()
        else:                                                          # <br/>, {x}, URL, stray
            innermost.children.append(Element(m.group(0), here))
    words += text[pos:].split()
    for k in range(len(stack) - 1, 0, -1):                             # never closed: standalone
        _unwrap(stack[k - 1][0], stack[k][0])
    if not root.children:
        return Stripped(text, len(text.split()), [])
    return Stripped(" ".join(words), len(words), root.children)


def _unwrap(parent: Element, element: Element) -> None:
    """Make an unclosed ``element`` standalone: its children move up after it."""
    i = parent.children.index(element)
    parent.children[i + 1:i + 1] = element.children
    element.children = []


def restore_markup(stripped: Stripped, translation: str, links: Sequence[tuple[int, int]]) -> str:
    """Put ``stripped``'s markup into ``translation`` (of ``stripped.text``) by ``links``
    (source word, target word); the translation's words are its whitespace-separated tokens."""
    if not stripped.elements:
        return translation
    words = translation.split()
    aligned: list[list[int]] = [[] for _ in range(stripped.n_words)]
    for i, j in links:
        if i < stripped.n_words and j < len(words):
            aligned[i].append(j)
    where = _Projection(aligned, len(words))
    out: list[tuple[str, str]] = []
    _emit(where.place(stripped.elements, 0, len(words)), 0, len(words), words, where, out)
    return _join(out)


class _Projection:
    """Source word boundaries and spans -> target ones, by the aligned target words."""

    def __init__(self, aligned: list[list[int]], n_target: int):
        self.aligned, self.m = aligned, n_target

    def point(self, k: int) -> int:
        n = len(self.aligned)
        if k < n and self.aligned[k]:
            return min(self.aligned[k])
        if 0 < k <= n and self.aligned[k - 1]:
            return max(self.aligned[k - 1]) + 1
        return round(k * self.m / n) if n else 0

    def span(self, e: Element) -> tuple[int, int]:
        start = self.point(e.start)
        if e.close is None:
            return start, start
        hit = [j for i in range(e.start, e.end) for j in self.aligned[i]]
        return (min(hit), max(hit) + 1) if hit else (start, max(start, self.point(e.end)))

    def place(self, elements: list[Element], lo: int, hi: int) -> list[tuple[int, int, Element]]:
        """Target spans of sibling ``elements`` inside [lo, hi], in target order, not overlapping."""
        spans = sorted(((*self.span(e), n, e) for n, e in enumerate(elements)), key=lambda x: x[:3])
        placed, cursor = [], lo
        for s, e, _, element in spans:
            s = min(max(s, cursor), hi)
            e = min(max(e, s), hi)
            placed.append((s, e, element))
            cursor = e
        return placed


def _emit(placed: list[tuple[int, int, Element]], lo: int, hi: int, words: list[str], where: _Projection,
          out: list[tuple[str, str]]) -> None:
    """Words lo..hi with the placed elements (and theirs, recursively) as (kind, text) items."""
    p = lo
    for s, e, element in placed:
        out.extend(("word", w) for w in words[p:s])
        p = s
        if element.close is None:
            out.append(("point", element.open))
            continue
        out.append(("open", element.open))
        _emit(where.place(element.children, s, e), s, e, words, where, out)
        out.append(("close", element.close))
        p = e
    out.extend(("word", w) for w in words[p:hi])


def _join(items: list[tuple[str, str]]) -> str:
    """Items joined by spaces, except after an opening tag and before a closing one."""
    text = ""
    for n, (kind, item) in enumerate(items):
        if n and items[n - 1][0] != "open" and kind != "close":
            text += " "
        text += item
    return text
