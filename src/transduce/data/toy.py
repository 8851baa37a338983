"""An embedded, offline English -> German-like language pair for demos and tests.

Sentences come from a small grammar and lexicon (about 210 English lemmas, 350 word forms);
the German side is a deterministic function of the English sentence (no noise, no ambiguity:
each English verb has one frame, "that" and "who" only introduce clauses, "you" is left out),
so a model can learn the mapping perfectly.
The grammar covers the phenomena that make German word order and morphology non-trivial:

- noun gender (der/die/das) and plural, with dative plural ``-n`` ("den Kindern");
- case: nominative subjects, accusative objects ("den Hund"), dative objects of *helfen*,
  *danken*, *folgen*, *antworten*, dative indirect objects ("gibt dem Kind einen Ball"),
  prepositions with dative or accusative, and contractions (im, beim, zum, zur);
- determiners der / ein / dieser / possessives / numerals / none, each with its adjective
  declension (weak, mixed, strong): "der große Hund", "einen großen Hund", "ein großer Hund",
  "große Hunde";
- verb agreement (ich laufe, er läuft, sie laufen), stem changes (sieht, liest, isst, hilft);
- verb second with a fronted adverbial or clause ("Heute sieht der Mann den Hund.");
- verb-final subordinate and relative clauses ("..., weil die Frau ein Buch liest.",
  "Der Mann, der schläft, ..."), ``dass`` clauses after say/think/know/believe;
- perfect with haben/sein and the participle at the end ("hat ... gesehen", "ist ...
  gelaufen"), future with werden and modal können with the infinitive at the end;
- yes/no questions with the verb first ("Sieht der Mann den Hund?").

Both sides are in sentence case with final punctuation; German nouns are capitalised. Lengths
run from 3 to 30 tokens (words and punctuation marks, see :func:`count_tokens`). Generation uses only
``random.Random(seed)``, so it is reproducible.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import random
import re
from pathlib import Path

from transduce.atomic import atomic_write_text

from .toy_grammar import NP, Clause, Noun, Verb, de_main, de_question, de_subordinate, en_clause, lexicon
from .toy_tables import (DEF, MAIN_FRAMES, PL_DETS, PRONOUNS, RELATIVE_FRAMES, SG_DETS, SUB_FRAMES, TENSE_LABELS,
                         TENSES)

logger = logging.getLogger(__name__)

MAX_TOKENS = 30  # per side; longer samples are redrawn


def count_tokens(text: str) -> int:
    """Words plus punctuation marks: "He sleeps." has 3 tokens."""
    return len(re.findall(r"[^\W_]+|[^\w\s]", text))


# ---- sampling ---------------------------------------------------------------------------------

def _weighted(rng: random.Random, table: tuple[tuple[str, int], ...]) -> str:
    keys, cum_weights = _cumulative(table)
    return rng.choices(keys, cum_weights=cum_weights)[0]


@functools.cache
def _cumulative(table: tuple[tuple[str, int], ...]) -> tuple[list[str], list[int]]:
    keys = [k for k, _ in table]
    return keys, list(itertools.accumulate(w for _, w in table))


@functools.cache
def _nouns_with(tags: frozenset[str]) -> tuple[Noun, ...]:
    return tuple(n for n in lexicon().nouns if n.tags & tags)


@functools.cache
def _verbs_with(frames: frozenset[str]) -> tuple[Verb, ...]:
    return tuple(v for v in lexicon().verbs if v.frame in frames)


def _sample_np(rng: random.Random, tags: frozenset[str]) -> NP:
    noun = rng.choice(_nouns_with(tags))
    plural = rng.random() < 0.3
    det = _weighted(rng, PL_DETS if plural else SG_DETS)
    n_adjs = 0 if rng.random() < 0.7 else (1 if rng.random() < 0.85 else 2)
    adjs = tuple(rng.sample(lexicon().adjectives, n_adjs))
    very = n_adjs == 1 and rng.random() < 0.15
    return NP(noun, det, adjs, very, plural)


def _sample_subject(rng: random.Random, tags: frozenset[str]) -> NP:
    if rng.random() < 0.25:
        en, de, person = rng.choice(PRONOUNS)
        return NP(None, pronoun=(en, de), pronoun_person=person)
    return _sample_np(rng, tags)


def _sample_objects(rng: random.Random, verb: Verb) -> tuple[tuple[NP, str], ...]:
    animate = frozenset({"animate"})
    if verb.frame == "acc":
        return ((_sample_np(rng, verb.tags), "acc"),)
    if verb.frame == "dat":
        return ((_sample_np(rng, animate), "dat"),)
    if verb.frame == "ditr":
        return ((_sample_np(rng, animate), "dat"), (_sample_np(rng, verb.tags), "acc"))
    return ()


def _sample_copula(rng: random.Random, subj: NP, tense: str) -> Clause:
    adj = rng.choice(lexicon().adjectives)
    return Clause(subj, None, tense, pred=(rng.random() < 0.2, adj))


def _sample_clause(rng: random.Random, main: bool) -> Clause:
    """A clause; only main clauses may take a dass-clause or a subject relative clause."""
    lex = lexicon()
    tense = _weighted(rng, TENSES)
    if rng.random() < 0.1:
        return _sample_copula(rng, _sample_subject(rng, frozenset({"animate", "thing", "place"})),
                              tense)
    subj = _sample_subject(rng, frozenset({"animate"}))
    verb = rng.choice(_verbs_with(MAIN_FRAMES if main else SUB_FRAMES))
    adv = rng.choice(lex.manner_adverbs) if rng.random() < 0.15 else None
    pp = None
    if verb.frame != "clause" and rng.random() < 0.25:
        prep = rng.choice(lex.preps)
        pp = (prep, _sample_np(rng, prep.tags))
    comp = _sample_clause(rng, main=False) if verb.frame == "clause" else None
    rc = None
    if main and subj.noun is not None and rng.random() < 0.12:
        rc = _sample_relative(rng, subj)
    return Clause(subj, verb, tense, _sample_objects(rng, verb), None, adv, pp, comp, rc)


def _sample_relative(rng: random.Random, head: NP) -> Clause:
    """A short subject relative clause: who -> der/die/das/die agreeing with ``head``."""
    pronoun = NP(None, pronoun=("who", DEF["nom"][head.gender]), pronoun_person=head.person)
    verb = rng.choice(_verbs_with(RELATIVE_FRAMES))
    tense = "perf" if rng.random() < 0.3 else "pres"
    return Clause(pronoun, verb, tense, _sample_objects(rng, verb))


def _sample_declarative(rng: random.Random) -> tuple[list[str], list[str], Clause]:
    """English words, German words and the main clause of a declarative sentence."""
    lex = lexicon()
    main = _sample_clause(rng, main=True)
    r = rng.random()
    if r < 0.2:  # fronted adverbial: verb second, subject after the verb
        adv = rng.choice(lex.time_adverbs)
        en, de = adv[0].split() + en_clause(main), de_main(main, adv[1].split())
    elif r < 0.28 and main.comp is None:  # fronted subordinate clause fills the prefield
        conj, sub = rng.choice(lex.conjunctions), _sample_clause(rng, main=False)
        en = [conj[0]] + en_clause(sub) + [","] + en_clause(main)
        de = de_main(main, [conj[1]] + de_subordinate(sub) + [","])
    else:
        en, de = en_clause(main), de_main(main)
        if main.comp is None and r < 0.5:
            en_tail, de_tail = _sample_tail(rng, r < 0.39)
            en, de = en + en_tail, de + de_tail
    return en + ["."], de + ["."], main


def _sample_tail(rng: random.Random, subordinate: bool) -> tuple[list[str], list[str]]:
    """A trailing subordinate clause (verb final) or a coordinated main clause."""
    lex = lexicon()
    if subordinate:
        conj, sub = rng.choice(lex.conjunctions), _sample_clause(rng, main=False)
        return [",", conj[0]] + en_clause(sub), [",", conj[1]] + de_subordinate(sub)
    second = _sample_clause(rng, main=False)
    en_conj, de_conj = (["and"], ["und"]) if rng.random() < 0.7 else ([",", "but"], [",", "aber"])
    if rng.random() < 0.2:
        adv = rng.choice(lex.time_adverbs)
        return (en_conj + adv[0].split() + en_clause(second),
                de_conj + de_main(second, adv[1].split()))
    return en_conj + en_clause(second), de_conj + de_main(second)


def _sample_sentence(rng: random.Random) -> tuple[str, str, str]:
    """One (English, German) sentence pair of at most MAX_TOKENS tokens per side, and the tense
    of its (first) main clause."""
    while True:
        if rng.random() < 0.12:
            main = _sample_clause(rng, main=True)
            en, de = en_clause(main, question=True) + ["?"], de_question(main) + ["?"]
        else:
            en, de, main = _sample_declarative(rng)
        en_text, de_text = join_words(en), join_words(de)
        if count_tokens(en_text) <= MAX_TOKENS and count_tokens(de_text) <= MAX_TOKENS:
            return en_text, de_text, main.tense


def join_words(words: list[str]) -> str:
    """Words to a sentence: punctuation attached, doubled/dangling commas removed, capitalised."""
    out: list[str] = []
    for w in words:
        if w in (",", ".", "?"):
            if out and out[-1].endswith(","):
                out[-1] = out[-1][:-1]
            out[-1] += w
        else:
            out.append(w)
    out[0] = out[0][0].upper() + out[0][1:]
    return " ".join(out)


# ---- corpus -----------------------------------------------------------------------------------

def generate_sentences(n: int, seed: int) -> list[tuple[str, str, str]]:
    """``n`` distinct (English, German, main-clause tense) triples (no English sentence
    repeats), from ``seed``."""
    rng = random.Random(seed)
    seen: set[str] = set()
    out: list[tuple[str, str, str]] = []
    attempts = 0
    while len(out) < n:
        attempts += 1
        if attempts > 20 * n + 1000:
            raise ValueError(f"cannot draw {n} distinct toy sentences")
        en, de, tense = _sample_sentence(rng)
        if en not in seen:
            seen.add(en)
            out.append((en, de, tense))
    return out


def generate_pairs(n: int, seed: int) -> list[tuple[str, str]]:
    """``n`` distinct (English, German) pairs (no English sentence repeats), from ``seed``."""
    return [(en, de) for en, de, _ in generate_sentences(n, seed)]


def _split(items: list, n_train: int, n_valid: int) -> dict[str, list]:
    return {"train": items[:n_train], "valid": items[n_train:n_train + n_valid], "test": items[n_train + n_valid:]}


def make_splits(seed: int = 0, n_train: int = 20000, n_valid: int = 500, n_test: int = 500
                ) -> dict[str, list[tuple[str, str]]]:
    """Disjoint train / valid / test splits: no English sentence occurs in two splits."""
    return _split(generate_pairs(n_train + n_valid + n_test, seed), n_train, n_valid)


def make_tense_splits(seed: int = 0, n_train: int = 20000, n_valid: int = 500, n_test: int = 500,
                      n_labelled: int | None = None) -> dict[str, list[tuple[str, str]]]:
    """A classification task from the grammar: (English sentence, tense of its main clause).

    The sentences are :func:`make_splits`' English side, the same splits; ``n_labelled`` keeps
    only the first that many of the training split (a small labelled set beside a large
    unlabelled one). The label is one of :data:`TENSE_LABELS`' values. It is not one word at one
    place: the finite verb ("runs", "has", "will", "can", "does" in a question) moves with
    the subject's length and a fronted adverbial or clause, and subordinate, coordinated and
    relative clauses carry tenses of their own ("Because the dog will sleep, the cat runs."
    is present).
    """
    rows = [(en, TENSE_LABELS[tense]) for en, _, tense in generate_sentences(n_train + n_valid + n_test, seed)]
    splits = _split(rows, n_train, n_valid)
    if n_labelled is not None:
        splits["train"] = splits["train"][:n_labelled]
    return splits


def write_splits(out_dir: str | os.PathLike,
                 splits: dict[str, list[tuple[str, str]]] | None = None, seed: int = 0,
                 src_lang: str = "en", tgt_lang: str = "de") -> dict[str, tuple[Path, Path]]:
    """Write ``{split}.{src_lang}`` and ``{split}.{tgt_lang}`` files (atomically) into ``out_dir``.

    Args:
        splits: as returned by :func:`make_splits`; generated from ``seed`` when None.

    Returns:
        split name -> (source path, target path).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    splits = make_splits(seed) if splits is None else splits
    paths = {}
    for name, pairs in splits.items():
        src, tgt = out / f"{name}.{src_lang}", out / f"{name}.{tgt_lang}"
        _write_text(src, [s for s, _ in pairs])
        _write_text(tgt, [t for _, t in pairs])
        paths[name] = (src, tgt)
    logger.info("wrote toy corpus (%s) to %s",
                ", ".join(f"{k} {len(v)}" for k, v in splits.items()), out)
    return paths


def _write_text(path: Path, lines: list[str]) -> None:
    atomic_write_text(path, "".join(line + "\n" for line in lines))
