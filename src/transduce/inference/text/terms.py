"""Where a translation's constraints come from: the input line (fairseq's convention,
``source<TAB>phrase<TAB>phrase``) and a glossary (a TSV file, ``source term<TAB>target term``).

A glossary term applies to a sentence when its source term occurs in it, matched on whole words
(runs of letters, digits and ``_``; a term of several words matches them in sequence),
case-sensitively unless ``ignore_case``. The target terms of the terms that apply become the
sentence's constraints (:mod:`~transduce.inference.search.constraints`), after those of the input
line: a target term as many times as its source terms occur (a sentence that says "dog" twice
gets "Hund" twice), less the copies the input line already gives. Occurrences do not overlap, the
longest source term first: with "dog" and "red dog" in the glossary, "a red dog" gets only the
target of "red dog".
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Sequence

from ...data.corpus import read_lines
from ...errors import DataError

_WORD = re.compile(r"\w+")


def _words(text: str, ignore_case: bool) -> list[str]:
    return _WORD.findall(text.lower() if ignore_case else text)


def _matches(terms: list[list[str]], words: list[str]) -> list[int]:
    """How many times each of ``terms`` occurs in ``words``: longest terms first (then the
    earliest), each word in one occurrence at most."""
    found = sorted((-len(t), i, j) for j, t in enumerate(terms) if t
                   for i in range(len(words) - len(t) + 1) if words[i:i + len(t)] == t)
    taken, counts = [False] * len(words), [0] * len(terms)
    for minus_n, i, j in found:
        if not any(taken[i:i - minus_n]):
            taken[i:i - minus_n] = [True] * -minus_n
            counts[j] += 1
    return counts


@dataclass(frozen=True)
class Glossary:
    """Source term -> target term pairs, in file order."""

    terms: tuple[tuple[str, str], ...]
    ignore_case: bool = False

    @classmethod
    def load(cls, path: str | os.PathLike, ignore_case: bool = False) -> "Glossary":
        """Read a TSV glossary: one ``source term<TAB>target term`` a line; empty lines and lines
        starting with ``#`` are skipped. A one-line DataError names a malformed line."""
        terms = []
        for n, line in enumerate(read_lines(path), 1):
            if not line.strip() or line.startswith("#"):
                continue
            fields = line.split("\t")
            if len(fields) != 2 or not _words(fields[0], False) or not fields[1].strip():
                raise DataError(f"{path}:{n}: a glossary line is 'source term<TAB>target term' (a word or more "
                                f"each); got {line[:60]!r}")
            terms.append((fields[0].strip(), fields[1].strip()))
        return cls(tuple(terms), ignore_case)

    def targets(self, text: str) -> list[str]:
        """The target terms of the source terms that occur in ``text``, each once per occurrence."""
        counts = _matches([_words(src, self.ignore_case) for src, _ in self.terms], _words(text, self.ignore_case))
        return [tgt for (_, tgt), n in zip(self.terms, counts) for _ in range(n)]


@dataclass(frozen=True)
class Terms:
    """How to find each input line's constraints: TAB-separated phrases after the source
    (``from_input``), a ``glossary``, or both."""

    from_input: bool = False
    glossary: Glossary | None = None

    def split(self, lines: Sequence[str]) -> tuple[list[str], list[list[str]] | None]:
        """The source texts of ``lines`` and each one's constraints (None when neither source
        of constraints is set: plain translation)."""
        if not self.from_input and self.glossary is None:
            return list(lines), None
        sources, constraints = [], []
        for line in lines:
            fields = line.split("\t") if self.from_input else [line]
            phrases = [p.strip() for p in fields[1:] if p.strip()]
            if self.glossary is not None:
                found = self.glossary.targets(fields[0])
                for term in dict.fromkeys(found):  # the copies the line does not give already
                    phrases += [term] * (found.count(term) - phrases.count(term))
            sources.append(fields[0])
            constraints.append(phrases)
        return sources, constraints
