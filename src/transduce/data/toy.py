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
from dataclasses import dataclass
from pathlib import Path

from transduce.atomic import atomic_write_text

logger = logging.getLogger(__name__)

MAX_TOKENS = 30  # per side; longer samples are redrawn
SPLIT_NAMES = ("train", "valid", "test")

# ---- lexicon ---------------------------------------------------------------------------------
# nouns: en_sg en_pl de_sg de_pl gender tags
_NOUNS = """
man men Mann Männer m animate
woman women Frau Frauen f animate
child children Kind Kinder n animate
dog dogs Hund Hunde m animate
cat cats Katze Katzen f animate
teacher teachers Lehrer Lehrer m animate
girl girls Mädchen Mädchen n animate
friend friends Freund Freunde m animate
doctor doctors Arzt Ärzte m animate
king kings König Könige m animate
queen queens Königin Königinnen f animate
bird birds Vogel Vögel m animate
horse horses Pferd Pferde n animate
mouse mice Maus Mäuse f animate
sister sisters Schwester Schwestern f animate
brother brothers Bruder Brüder m animate
cook cooks Koch Köche m animate
mother mothers Mutter Mütter f animate
father fathers Vater Väter m animate
cow cows Kuh Kühe f animate
uncle uncles Onkel Onkel m animate
aunt aunts Tante Tanten f animate
book books Buch Bücher n thing,read
letter letters Brief Briefe m thing,read
newspaper newspapers Zeitung Zeitungen f thing,read
apple apples Apfel Äpfel m thing,food
cake cakes Kuchen Kuchen m thing,food
egg eggs Ei Eier n thing,food
banana bananas Banane Bananen f thing,food
ball balls Ball Bälle m thing
car cars Auto Autos n thing
table tables Tisch Tische m thing
chair chairs Stuhl Stühle m thing
bag bags Tasche Taschen f thing
cup cups Tasse Tassen f thing
flower flowers Blume Blumen f thing
key keys Schlüssel Schlüssel m thing
hat hats Hut Hüte m thing
picture pictures Bild Bilder n thing
bike bikes Fahrrad Fahrräder n thing
door doors Tür Türen f thing
window windows Fenster Fenster n thing
glass glasses Glas Gläser n thing
shoe shoes Schuh Schuhe m thing
coat coats Mantel Mäntel m thing
lamp lamps Lampe Lampen f thing
bottle bottles Flasche Flaschen f thing
box boxes Kiste Kisten f thing
clock clocks Uhr Uhren f thing
park parks Park Parks m place
garden gardens Garten Gärten m place
city cities Stadt Städte f place
school schools Schule Schulen f place
kitchen kitchens Küche Küchen f place
forest forests Wald Wälder m place
street streets Straße Straßen f place
station stations Bahnhof Bahnhöfe m place
market markets Markt Märkte m place
village villages Dorf Dörfer n place
house houses Haus Häuser n place
room rooms Zimmer Zimmer n place
church churches Kirche Kirchen f place
bridge bridges Brücke Brücken f place
tree trees Baum Bäume m place
"""

# verbs: en en_3sg en_participle de_inf de_1sg de_3sg de_participle aux frame object_tags
# frames: intr, acc (accusative object), dat (dative object), ditr (dative + accusative),
# clause (a dass-clause). Each English verb has exactly one frame, so parses are unique.
_VERBS = """
sleep sleeps slept schlafen schlafe schläft geschlafen haben intr -
run runs run laufen laufe läuft gelaufen sein intr -
laugh laughs laughed lachen lache lacht gelacht haben intr -
swim swims swum schwimmen schwimme schwimmt geschwommen sein intr -
wait waits waited warten warte wartet gewartet haben intr -
come comes come kommen komme kommt gekommen sein intr -
sing sings sung singen singe singt gesungen haben intr -
dance dances danced tanzen tanze tanzt getanzt haben intr -
play plays played spielen spiele spielt gespielt haben intr -
work works worked arbeiten arbeite arbeitet gearbeitet haben intr -
cry cries cried weinen weine weint geweint haben intr -
go goes gone gehen gehe geht gegangen sein intr -
jump jumps jumped springen springe springt gesprungen sein intr -
see sees seen sehen sehe sieht gesehen haben acc animate,thing,place
find finds found finden finde findet gefunden haben acc animate,thing
like likes liked mögen mag mag gemocht haben acc animate,thing,place
love loves loved lieben liebe liebt geliebt haben acc animate
visit visits visited besuchen besuche besucht besucht haben acc animate,place
read reads read lesen lese liest gelesen haben acc read
buy buys bought kaufen kaufe kauft gekauft haben acc thing
carry carries carried tragen trage trägt getragen haben acc thing,animate
need needs needed brauchen brauche braucht gebraucht haben acc thing
eat eats eaten essen esse isst gegessen haben acc food
open opens opened öffnen öffne öffnet geöffnet haben acc thing
wash washes washed waschen wasche wäscht gewaschen haben acc thing,animate
paint paints painted malen male malt gemalt haben acc thing,animate,place
take takes taken nehmen nehme nimmt genommen haben acc thing
hear hears heard hören höre hört gehört haben acc animate
have has had haben habe hat gehabt haben acc thing,animate
help helps helped helfen helfe hilft geholfen haben dat animate
thank thanks thanked danken danke dankt gedankt haben dat animate
follow follows followed folgen folge folgt gefolgt sein dat animate
answer answers answered antworten antworte antwortet geantwortet haben dat animate
give gives given geben gebe gibt gegeben haben ditr thing
show shows shown zeigen zeige zeigt gezeigt haben ditr thing
bring brings brought bringen bringe bringt gebracht haben ditr thing
send sends sent schicken schicke schickt geschickt haben ditr thing
say says said sagen sage sagt gesagt haben clause -
think thinks thought denken denke denkt gedacht haben clause -
know knows known wissen weiß weiß gewusst haben clause -
believe believes believed glauben glaube glaubt geglaubt haben clause -
"""

_ADJECTIVES = """
big groß|small klein|old alt|young jung|new neu|red rot|blue blau|green grün|good gut
beautiful schön|tired müde|happy glücklich|fast schnell|black schwarz|white weiß
hungry hungrig|funny lustig|yellow gelb|cold kalt|heavy schwer|clever klug
friendly freundlich|brown braun|long lang|short kurz|loud laut|sad traurig
"""

_TIME_ADVERBS = """
today|heute
now|jetzt
often|oft
sometimes|manchmal
tomorrow|morgen
in the morning|am Morgen
in the evening|am Abend
at night|in der Nacht
on Sunday|am Sonntag
every day|jeden Tag
perhaps|vielleicht
unfortunately|leider
"""

_MANNER_ADVERBS = """
quickly|schnell
slowly|langsam
quietly|leise
loudly|laut
happily|fröhlich
carefully|vorsichtig
together|zusammen
alone|allein
"""

_CONJUNCTIONS = """
because|weil
although|obwohl
if|wenn
while|während
before|bevor
after|nachdem
"""

# prepositions: en|de|case|object tags|contractions of the definite article
_PREPOSITIONS = """
in|in|dat|place|dem=im
near|bei|dat|place,animate|dem=beim
to|zu|dat|place,animate|dem=zum,der=zur
behind|hinter|dat|place,thing|
next to|neben|dat|place,thing,animate|
under|unter|dat|thing,place|
on|auf|dat|thing|
with|mit|dat|animate,thing|
without|ohne|acc|animate,thing|
for|für|acc|animate|
through|durch|acc|place|
"""

# subject pronouns: en, de, person ("you" is left out: du / ihr / Sie would be ambiguous)
_PRONOUNS = (("I", "ich", "1sg"), ("he", "er", "3sg"), ("she", "sie", "3sg"),
             ("it", "es", "3sg"), ("we", "wir", "pl"), ("they", "sie", "pl"))

# ---- German morphology -----------------------------------------------------------------------
_PERSON = {"1sg": 0, "3sg": 1, "pl": 2}
_DE_AUX = {"haben": ("habe", "hat", "haben"), "sein": ("bin", "ist", "sind"),
           "werden": ("werde", "wird", "werden"), "können": ("kann", "kann", "können")}
_EN_AUX = {"have": ("have", "has", "have"), "be": ("am", "is", "are"),
           "do": ("do", "does", "do")}
_DEF = {"nom": {"m": "der", "f": "die", "n": "das", "pl": "die"},
        "acc": {"m": "den", "f": "die", "n": "das", "pl": "die"},
        "dat": {"m": "dem", "f": "der", "n": "dem", "pl": "den"}}
_DIES_END = {"nom": {"m": "er", "f": "e", "n": "es", "pl": "e"},
             "acc": {"m": "en", "f": "e", "n": "es", "pl": "e"},
             "dat": {"m": "em", "f": "er", "n": "em", "pl": "en"}}
_EIN_END = {"nom": {"m": "", "f": "e", "n": "", "pl": "e"},
            "acc": {"m": "en", "f": "e", "n": "", "pl": "e"},
            "dat": {"m": "em", "f": "er", "n": "em", "pl": "en"}}
_STRONG_PL = {"nom": "e", "acc": "e", "dat": "en"}
_ADJ_END = {  # adjective endings by declension class (after which determiner)
    "weak": {"nom": {"m": "e", "f": "e", "n": "e", "pl": "en"},
             "acc": {"m": "en", "f": "e", "n": "e", "pl": "en"},
             "dat": {"m": "en", "f": "en", "n": "en", "pl": "en"}},
    "mixed": {"nom": {"m": "er", "f": "e", "n": "es", "pl": "en"},
              "acc": {"m": "en", "f": "e", "n": "es", "pl": "en"},
              "dat": {"m": "en", "f": "en", "n": "en", "pl": "en"}},
    "strong": {"nom": {"pl": "e"}, "acc": {"pl": "e"}, "dat": {"pl": "en"}},
}
# determiners: key -> (en singular, en plural, German kind, German stem); None = not allowed
_DETERMINERS = {
    "the": ("the", "the", "def", ""), "a": ("a", None, "ein", "ein"),
    "this": ("this", "these", "dies", "dies"), "my": ("my", "my", "ein", "mein"),
    "his": ("his", "his", "ein", "sein"), "her": ("her", "her", "ein", "ihr"),
    "our": ("our", "our", "ein", "unser"), "their": ("their", "their", "ein", "ihr"),
    "bare": (None, "", "bare", ""), "two": (None, "two", "num", "zwei"),
    "three": (None, "three", "num", "drei"), "many": (None, "many", "viel", "viel"),
}
_ADJ_CLASS = {"def": "weak", "dies": "weak", "ein": "mixed", "bare": "strong",
              "num": "strong", "viel": "strong"}
_SG_DETS = (("the", 45), ("a", 25), ("this", 8), ("my", 5), ("his", 5), ("her", 4),
            ("our", 4), ("their", 4))
_PL_DETS = (("the", 35), ("bare", 20), ("this", 8), ("two", 6), ("three", 4), ("many", 5),
            ("my", 6), ("his", 4), ("her", 4), ("our", 4), ("their", 4))
_TENSES = (("pres", 50), ("perf", 25), ("fut", 13), ("can", 12))
TENSE_LABELS = {"pres": "present", "perf": "perfect", "fut": "future", "can": "modal"}  # make_tense_splits' classes
_MAIN_FRAMES = frozenset({"intr", "acc", "dat", "ditr", "clause"})
_SUB_FRAMES = _MAIN_FRAMES - {"clause"}  # no dass-clause inside another clause
_RELATIVE_FRAMES = frozenset({"intr", "acc", "dat"})  # relative clauses stay short


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
        return (self.de_1sg, self.de_3sg, self.de)[_PERSON[person]]


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
    nouns = tuple(Noun(*f[:5], frozenset(f[5].split(","))) for f in _rows(_NOUNS, " "))
    verbs = tuple(Verb(*f[:9], frozenset(f[9].split(",")) - {"-"}) for f in _rows(_VERBS, " "))
    adjectives = tuple(tuple(a.split()) for a in _items(_ADJECTIVES))
    preps = tuple(Prep(f[0], f[1], f[2], frozenset(f[3].split(",")),
                       dict(c.split("=") for c in f[4].split(",") if c))
                  for f in _rows(_PREPOSITIONS, "|"))
    return Lexicon(nouns, verbs, adjectives, tuple(_pairs(_TIME_ADVERBS)),
                   tuple(_pairs(_MANNER_ADVERBS)), tuple(_pairs(_CONJUNCTIONS)), preps)


def _rows(table: str, sep: str) -> list[list[str]]:
    return [line.split(sep) for line in table.strip().splitlines()]


def _pairs(table: str) -> list[tuple[str, str]]:
    return [tuple(row) for row in _rows(table, "|")]


def _items(table: str) -> list[str]:
    return [item.strip() for line in table.strip().splitlines() for item in line.split("|")]


def count_tokens(text: str) -> int:
    """Words plus punctuation marks: "He sleeps." has 3 tokens."""
    return len(re.findall(r"[^\W_]+|[^\w\s]", text))


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
        sg, pl, _, _ = _DETERMINERS[self.det]
        words = (["very"] if self.very else []) + [a[0] for a in self.adjs]
        words.append(self.noun.en_pl if self.plural else self.noun.en)
        det = pl if self.plural else sg
        if det == "a" and words[0][0] in "aeiou":
            det = "an"
        return ([det] if det else []) + words

    def de(self, case: str) -> list[str]:
        if self.noun is None:
            return [self.pronoun[1]]
        _, _, kind, stem = _DETERMINERS[self.det]
        g = self.gender
        ending = _ADJ_END[_ADJ_CLASS[kind]][case][g]
        words = _de_determiner(kind, stem, g, case)
        words += (["sehr"] if self.very else []) + [_inflect(a[1], ending) for a in self.adjs]
        if self.plural:
            words.append(self.noun.de_dat_pl if case == "dat" else self.noun.de_pl)
        else:
            words.append(self.noun.de)
        return words


def _de_determiner(kind: str, stem: str, g: str, case: str) -> list[str]:
    if kind == "def":
        return [_DEF[case][g]]
    if kind == "dies":
        return [stem + _DIES_END[case][g]]
    if kind == "ein":
        return [stem + _EIN_END[case][g]]
    if kind == "viel":
        return [stem + _STRONG_PL[case]]
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
    p = _PERSON[c.subj.person]
    if c.verb is None:
        finite = {"pres": _EN_AUX["be"][p], "perf": _EN_AUX["have"][p],
                  "fut": "will", "can": "can"}[c.tense]
        return finite, {"pres": [], "perf": ["been"], "fut": ["be"], "can": ["be"]}[c.tense]
    v = c.verb
    if c.tense == "pres":
        if question:
            return _EN_AUX["do"][p], [v.en]
        return (v.en_3sg if c.subj.person == "3sg" else v.en), []
    if c.tense == "perf":
        return _EN_AUX["have"][p], [v.en_part]
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
    p = _PERSON[c.subj.person]
    if c.verb is None:
        finite_aux = {"pres": "sein", "perf": "sein", "fut": "werden", "can": "können"}[c.tense]
        final = {"pres": [], "perf": ["gewesen"], "fut": ["sein"], "can": ["sein"]}[c.tense]
        return _DE_AUX[finite_aux][p], final
    v = c.verb
    if c.tense == "pres":
        return v.de_finite(c.subj.person), []
    if c.tense == "perf":
        return _DE_AUX[v.aux][p], [v.de_part]
    return _DE_AUX["werden" if c.tense == "fut" else "können"][p], [v.de]


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
    det = _weighted(rng, _PL_DETS if plural else _SG_DETS)
    n_adjs = 0 if rng.random() < 0.7 else (1 if rng.random() < 0.85 else 2)
    adjs = tuple(rng.sample(lexicon().adjectives, n_adjs))
    very = n_adjs == 1 and rng.random() < 0.15
    return NP(noun, det, adjs, very, plural)


def _sample_subject(rng: random.Random, tags: frozenset[str]) -> NP:
    if rng.random() < 0.25:
        en, de, person = rng.choice(_PRONOUNS)
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
    tense = _weighted(rng, _TENSES)
    if rng.random() < 0.1:
        return _sample_copula(rng, _sample_subject(rng, frozenset({"animate", "thing", "place"})),
                              tense)
    subj = _sample_subject(rng, frozenset({"animate"}))
    verb = rng.choice(_verbs_with(_MAIN_FRAMES if main else _SUB_FRAMES))
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
    pronoun = NP(None, pronoun=("who", _DEF["nom"][head.gender]), pronoun_person=head.person)
    verb = rng.choice(_verbs_with(_RELATIVE_FRAMES))
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
