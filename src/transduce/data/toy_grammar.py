"""The toy pair's grammar: the parsed lexicon, noun phrases and clauses, and their English and
German realisation (word order, case, agreement; see :mod:`.toy` for what it covers)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from .toy_tables import (ADJ_CLASS, ADJ_END, ADJECTIVES, CONJUNCTIONS, DE_AUX, DEF, DETERMINERS, DIES_END, EIN_END,
                         EN_AUX, MANNER_ADVERBS, NOUNS, PERSON, PREPOSITIONS, STRONG_PL, TIME_ADVERBS, VERBS)


@dataclass(frozen=True)
class Noun:
    en: str
    en_pl: str
    de: str
    de_pl: str
    gender: str
    tags: frozenset[str]

    @property
    def de_dat_pl(self) -> str:
        """Dative plural adds -n unless the plural already ends in -n or -s."""
        return self.de_pl if self.de_pl.endswith(("n", "s")) else self.de_pl + "n"


@dataclass(frozen=True)
class Verb:
    en: str
    en_3sg: str
    en_part: str
    de: str
    de_1sg: str
    de_3sg: str
    de_part: str
    aux: str
    frame: str
    tags: frozenset[str]

    def de_finite(self, person: str) -> str:
        return (self.de_1sg, self.de_3sg, self.de)[PERSON[person]]


@dataclass(frozen=True)
class Prep:
    en: str
    de: str
    case: str
    tags: frozenset[str]
    contractions: dict


@dataclass(frozen=True)
class Lexicon:
    nouns: tuple[Noun, ...]
    verbs: tuple[Verb, ...]
    adjectives: tuple[tuple[str, str], ...]
    time_adverbs: tuple[tuple[str, str], ...]
    manner_adverbs: tuple[tuple[str, str], ...]
    conjunctions: tuple[tuple[str, str], ...]
    preps: tuple[Prep, ...]


@functools.cache
def lexicon() -> Lexicon:
    """The parsed word tables (built on first use, not at import)."""
    nouns = tuple(Noun(*f[:5], frozenset(f[5].split(","))) for f in _rows(NOUNS, " "))
    verbs = tuple(Verb(*f[:9], frozenset(f[9].split(",")) - {"-"}) for f in _rows(VERBS, " "))
    adjectives = tuple(tuple(a.split()) for a in _items(ADJECTIVES))
    preps = tuple(Prep(f[0], f[1], f[2], frozenset(f[3].split(",")),
                       dict(c.split("=") for c in f[4].split(",") if c))
                  for f in _rows(PREPOSITIONS, "|"))
    return Lexicon(nouns, verbs, adjectives, tuple(_pairs(TIME_ADVERBS)),
                   tuple(_pairs(MANNER_ADVERBS)), tuple(_pairs(CONJUNCTIONS)), preps)


def _rows(table: str, sep: str) -> list[list[str]]:
    return [line.split(sep) for line in table.strip().splitlines()]


def _pairs(table: str) -> list[tuple[str, str]]:
    return [tuple(row) for row in _rows(table, "|")]


def _items(table: str) -> list[str]:
    return [item.strip() for line in table.strip().splitlines() for item in line.split("|")]


# ---- phrases -------------------------------------------------------------------------------

@dataclass(frozen=True)
class NP:
    """A noun phrase, or a pronoun when ``noun`` is None (then ``pronoun`` is (en, de))."""

    noun: Noun | None
    det: str = "the"
    adjs: tuple[tuple[str, str], ...] = ()
    very: bool = False
    plural: bool = False
    pronoun: tuple[str, str] | None = None
    pronoun_person: str = "3sg"

    @property
    def person(self) -> str:
        if self.noun is None:
            return self.pronoun_person
        return "pl" if self.plural else "3sg"

    @property
    def gender(self) -> str:
        return "pl" if self.plural else self.noun.gender

    def en(self) -> list[str]:
        if self.noun is None:
            return [self.pronoun[0]]
        sg, pl, _, _ = DETERMINERS[self.det]
        words = (["very"] if self.very else []) + [a[0] for a in self.adjs]
        words.append(self.noun.en_pl if self.plural else self.noun.en)
        det = pl if self.plural else sg
        if det == "a" and words[0][0] in "aeiou":
            det = "an"
        return ([det] if det else []) + words

    def de(self, case: str) -> list[str]:
        if self.noun is None:
            return [self.pronoun[1]]
        _, _, kind, stem = DETERMINERS[self.det]
        g = self.gender
        ending = ADJ_END[ADJ_CLASS[kind]][case][g]
        words = _de_determiner(kind, stem, g, case)
        words += (["sehr"] if self.very else []) + [_inflect(a[1], ending) for a in self.adjs]
        if self.plural:
            words.append(self.noun.de_dat_pl if case == "dat" else self.noun.de_pl)
        else:
            words.append(self.noun.de)
        return words


def _de_determiner(kind: str, stem: str, g: str, case: str) -> list[str]:
    if kind == "def":
        return [DEF[case][g]]
    if kind == "dies":
        return [stem + DIES_END[case][g]]
    if kind == "ein":
        return [stem + EIN_END[case][g]]
    if kind == "viel":
        return [stem + STRONG_PL[case]]
    return [stem] if stem else []  # numerals do not decline; bare plurals have none


def _inflect(stem: str, ending: str) -> str:
    """Adjective stem + ending, without doubling an e (müde + e = müde, müde + en = müden)."""
    if stem.endswith("e") and ending.startswith("e"):
        return stem + ending[1:]
    return stem + ending


@dataclass(frozen=True)
class Clause:
    """One clause; ``verb`` None means a copula clause with predicative adjective ``pred``."""

    subj: NP
    verb: Verb | None
    tense: str
    objs: tuple[tuple[NP, str], ...] = ()  # (phrase, case), German middle-field order
    pred: tuple[bool, tuple[str, str]] | None = None  # (very, adjective)
    adv: tuple[str, str] | None = None
    pp: tuple[Prep, NP] | None = None
    comp: "Clause | None" = None  # dass-clause
    rc: "Clause | None" = None  # relative clause on the subject


# ---- English realisation ----------------------------------------------------------------------

def _en_verb_group(c: Clause, question: bool) -> tuple[str, list[str]]:
    """(finite word, following verb words) in English."""
    p = PERSON[c.subj.person]
    if c.verb is None:
        finite = {"pres": EN_AUX["be"][p], "perf": EN_AUX["have"][p],
                  "fut": "will", "can": "can"}[c.tense]
        return finite, {"pres": [], "perf": ["been"], "fut": ["be"], "can": ["be"]}[c.tense]
    v = c.verb
    if c.tense == "pres":
        if question:
            return EN_AUX["do"][p], [v.en]
        return (v.en_3sg if c.subj.person == "3sg" else v.en), []
    if c.tense == "perf":
        return EN_AUX["have"][p], [v.en_part]
    return ("will" if c.tense == "fut" else "can"), [v.en]


def _en_rest(c: Clause) -> list[str]:
    """Everything after the verb group: objects, predicate, adverb, PP, that-clause."""
    words = [w for np, _ in c.objs for w in np.en()]
    if c.pred is not None:
        words += (["very"] if c.pred[0] else []) + [c.pred[1][0]]
    if c.adv is not None:
        words.append(c.adv[0])
    if c.pp is not None:
        words += c.pp[0].en.split() + c.pp[1].en()
    if c.comp is not None:
        words += ["that"] + en_clause(c.comp)
    return words


def _en_subject(c: Clause) -> list[str]:
    words = c.subj.en()
    if c.rc is not None:
        words += en_clause(c.rc)
    return words


def en_clause(c: Clause, question: bool = False) -> list[str]:
    """English words of a clause (declarative order, or a yes/no question)."""
    finite, rest = _en_verb_group(c, question)
    if question:
        return [finite] + _en_subject(c) + rest + _en_rest(c)
    return _en_subject(c) + [finite] + rest + _en_rest(c)


# ---- German realisation -----------------------------------------------------------------------

def _de_verb_group(c: Clause) -> tuple[str, list[str]]:
    """(finite verb, clause-final verbs) in German."""
    p = PERSON[c.subj.person]
    if c.verb is None:
        finite_aux = {"pres": "sein", "perf": "sein", "fut": "werden", "can": "können"}[c.tense]
        final = {"pres": [], "perf": ["gewesen"], "fut": ["sein"], "can": ["sein"]}[c.tense]
        return DE_AUX[finite_aux][p], final
    v = c.verb
    if c.tense == "pres":
        return v.de_finite(c.subj.person), []
    if c.tense == "perf":
        return DE_AUX[v.aux][p], [v.de_part]
    return DE_AUX["werden" if c.tense == "fut" else "können"][p], [v.de]


def _de_middle(c: Clause) -> list[str]:
    """Middle field after the subject: objects (dative first), predicate, adverb, PP."""
    words = [w for np, case in c.objs for w in np.de(case)]
    if c.pred is not None:
        words += (["sehr"] if c.pred[0] else []) + [c.pred[1][1]]
    if c.adv is not None:
        words.append(c.adv[1])
    if c.pp is not None:
        words += _de_pp(*c.pp)
    return words


def _de_pp(prep: Prep, np: NP) -> list[str]:
    words = np.de(prep.case)
    if np.det == "the" and words[0] in prep.contractions:
        return [prep.contractions[words[0]]] + words[1:]  # in dem -> im, zu der -> zur
    return [prep.de] + words


def _de_subject(c: Clause) -> list[str]:
    words = c.subj.de("nom")
    if c.rc is not None:
        words += [","] + de_subordinate(c.rc) + [","]
    return words


def _de_comp(c: Clause) -> list[str]:
    return [",", "dass"] + de_subordinate(c.comp) if c.comp is not None else []


def de_subordinate(c: Clause) -> list[str]:
    """Verb-final order: subject, middle field, non-finite verbs, finite verb."""
    finite, final = _de_verb_group(c)
    return _de_subject(c) + _de_middle(c) + final + [finite]


def de_main(c: Clause, prefield: list[str] | None = None) -> list[str]:
    """Verb-second order; the subject comes after the verb when ``prefield`` is given."""
    finite, final = _de_verb_group(c)
    if prefield is None:
        return _de_subject(c) + [finite] + _de_middle(c) + final + _de_comp(c)
    return prefield + [finite] + _de_subject(c) + _de_middle(c) + final + _de_comp(c)


def de_question(c: Clause) -> list[str]:
    """Verb-first order of a yes/no question."""
    finite, final = _de_verb_group(c)
    return [finite] + _de_subject(c) + _de_middle(c) + final + _de_comp(c)
