import random
import re

import pytest

from transduce.data import toy, toy_tables
from transduce.data.corpus import read_parallel
from transduce.data.toy import count_tokens, generate_pairs, join_words, make_splits, write_splits
from transduce.data.toy_grammar import NP, Clause, de_main, de_question, de_subordinate, en_clause, lexicon

LEX = lexicon()
NOUNS = {n.en: n for n in LEX.nouns}
NOUNS_PL = {n.en_pl: n for n in LEX.nouns}
VERBS = {v.en: v for v in LEX.verbs}
ADJ = dict(LEX.adjectives)
FINITE = ({f for v in LEX.verbs for f in (v.de_1sg, v.de_3sg, v.de)}
          | {f for forms in toy_tables.DE_AUX.values() for f in forms})
ARTICLE = {"m": "Der", "f": "Die", "n": "Das"}


def np(noun: str, det: str = "the", adjs: tuple[str, ...] = (), plural: bool = False) -> NP:
    return NP(NOUNS[noun], det, tuple((a, ADJ[a]) for a in adjs), False, plural)


def clause(subj: NP, verb: str, tense: str = "pres", objs=(), **kwargs) -> Clause:
    return Clause(subj, VERBS[verb], tense, tuple(objs), **kwargs)


@pytest.fixture(scope="module")
def corpus() -> list[tuple[str, str]]:
    return generate_pairs(12000, seed=0)


# ---- hand-built sentences: the realisation rules ---------------------------------------------

@pytest.mark.parametrize("det,adjs,plural,case,expected", [
    ("the", ("big",), False, "nom", "der große Hund"),
    ("the", ("big",), False, "acc", "den großen Hund"),
    ("the", ("big",), False, "dat", "dem großen Hund"),
    ("a", ("big",), False, "nom", "ein großer Hund"),
    ("a", ("big",), False, "acc", "einen großen Hund"),
    ("a", ("big",), False, "dat", "einem großen Hund"),
    ("this", ("big",), True, "dat", "diesen großen Hunden"),
    ("bare", ("big",), True, "nom", "große Hunde"),
    ("two", ("big", "black"), True, "dat", "zwei großen schwarzen Hunden"),
    ("many", (), True, "dat", "vielen Hunden"),
    ("our", ("tired",), True, "acc", "unsere müden Hunde"),
])
def test_masculine_declension(det, adjs, plural, case, expected):
    assert " ".join(np("dog", det, adjs, plural).de(case)) == expected


@pytest.mark.parametrize("noun,det,case,expected", [
    ("cat", "a", "nom", "eine müde Katze"),
    ("cat", "my", "dat", "meiner müden Katze"),
    ("child", "a", "nom", "ein müdes Kind"),
    ("child", "the", "nom", "das müde Kind"),
    ("child", "her", "acc", "ihr müdes Kind"),
])
def test_feminine_and_neuter_declension(noun, det, case, expected):
    assert " ".join(np(noun, det, ("tired",)).de(case)) == expected


def test_english_indefinite_article_before_vowels():
    assert np("apple", "a").en() == ["an", "apple"]
    assert np("dog", "a", ("old",)).en() == ["an", "old", "dog"]
    assert np("mouse", "this", plural=True).en() == ["these", "mice"]


def _pair(en: list[str], de: list[str], end: str = ".") -> tuple[str, str]:
    return join_words(en + [end]), join_words(de + [end])


def test_fronted_adverb_puts_the_verb_second():
    c = clause(np("man"), "see", objs=[(np("dog"), "acc")])
    assert _pair(["today"] + en_clause(c), de_main(c, ["heute"])) == \
        ("Today the man sees the dog.", "Heute sieht der Mann den Hund.")


def test_subordinate_clause_puts_the_verb_last():
    main = clause(np("man"), "sleep")
    sub = clause(np("woman"), "read", objs=[(np("book", "a"), "acc")])
    en = en_clause(main) + [",", "because"] + en_clause(sub)
    de = de_main(main) + [",", "weil"] + de_subordinate(sub)
    assert _pair(en, de) == ("The man sleeps, because the woman reads a book.",
                             "Der Mann schläft, weil die Frau ein Buch liest.")
    front = de_main(main, ["weil"] + de_subordinate(sub) + [","])
    assert join_words(front + ["."]) == "Weil die Frau ein Buch liest, schläft der Mann."


@pytest.mark.parametrize("verb,tense,en,de", [
    ("see", "perf", "The man has seen the dog.", "Der Mann hat den Hund gesehen."),
    ("see", "fut", "The man will see the dog.", "Der Mann wird den Hund sehen."),
    ("see", "can", "The man can see the dog.", "Der Mann kann den Hund sehen."),
    ("follow", "perf", "The man has followed the dog.", "Der Mann ist dem Hund gefolgt."),
])
def test_compound_tenses_put_the_participle_or_infinitive_last(verb, tense, en, de):
    case = "dat" if VERBS[verb].frame == "dat" else "acc"
    c = clause(np("man"), verb, tense, objs=[(np("dog"), case)])
    assert _pair(en_clause(c), de_main(c)) == (en, de)


def test_agreement_in_number_and_person():
    for subj, en, de in [(np("child"), "The child runs.", "Das Kind läuft."),
                         (np("child", plural=True), "The children run.", "Die Kinder laufen."),
                         (NP(None, pronoun=("I", "ich"), pronoun_person="1sg"),
                          "I run.", "Ich laufe."),
                         (NP(None, pronoun=("we", "wir"), pronoun_person="pl"),
                          "We have run.", "Wir sind gelaufen.")]:
        c = clause(subj, "run", "perf" if "have" in en else "pres")
        assert _pair(en_clause(c), de_main(c)) == (en, de)


def test_question_relative_clause_dative_and_contraction():
    rc = clause(NP(None, pronoun=("who", "der"), pronoun_person="3sg"), "sleep")
    main = clause(np("man"), "see", objs=[(np("dog"), "acc")], rc=rc)
    assert _pair(en_clause(main), de_main(main)) == \
        ("The man who sleeps sees the dog.", "Der Mann, der schläft, sieht den Hund.")
    assert _pair(en_clause(main, question=True), de_question(main), "?") == \
        ("Does the man who sleeps see the dog?", "Sieht der Mann, der schläft, den Hund?")
    park = next(p for p in LEX.preps if p.en == "in")
    give = clause(np("woman"), "give", objs=[(np("child"), "dat"), (np("ball", "a"), "acc")],
                  pp=(park, np("park")))
    assert _pair(en_clause(give), de_main(give)) == \
        ("The woman gives the child a ball in the park.",
         "Die Frau gibt dem Kind einen Ball im Park.")


# ---- the generated corpus ----------------------------------------------------------------------

def test_generation_is_deterministic_by_seed():
    assert generate_pairs(300, seed=5) == generate_pairs(300, seed=5)
    assert generate_pairs(300, seed=5) != generate_pairs(300, seed=6)


def test_german_and_the_main_clause_tense_are_functions_of_english():
    rng = random.Random(99)
    seen: dict[str, tuple[str, str]] = {}
    for _ in range(20000):
        en, de, tense = toy._sample_sentence(rng)
        assert seen.setdefault(en, (de, tense)) == (de, tense), en
    assert len(seen) > 17000


def test_tense_splits_label_make_splits_english_side():
    splits, tenses = make_splits(seed=3, n_train=400, n_valid=50, n_test=50), toy.make_tense_splits(
        seed=3, n_train=400, n_valid=50, n_test=50, n_labelled=100)
    assert [len(tenses[k]) for k in ("train", "valid", "test")] == [100, 50, 50]
    assert [t for t, _ in tenses["train"]] == [en for en, _ in splits["train"][:100]]
    assert [t for t, _ in tenses["test"]] == [en for en, _ in splits["test"]]
    labels = {label for split in tenses.values() for _, label in split}
    assert labels == set(toy.TENSE_LABELS.values())
    by_text = dict(tenses["test"])
    for text, label in by_text.items():  # the finite verb of a simple sentence shows the tense
        if text.startswith("Will "):
            assert label == "future"
        elif text.startswith(("Can ", "Does ", "Do ")):
            assert label == {"Can": "modal"}.get(text.split()[0], "present")


def test_lengths_spread_from_3_to_30(corpus):
    lengths = [count_tokens(s) for pair in corpus for s in pair]
    assert min(lengths) == 3 and max(lengths) <= toy.MAX_TOKENS
    assert 7 < sum(lengths) / len(lengths) < 15
    assert sum(n >= 20 for n in lengths) > 0.01 * len(lengths)
    words = {w.lower() for en, _ in corpus for w in re.findall(r"\w+", en)}
    assert 150 < len(words) < 400


def test_verb_second_after_fronted_adverb(corpus):
    adverbs = {en.capitalize(): de.capitalize() for en, de in LEX.time_adverbs if " " not in en}
    checked = 0
    for en, de in corpus:
        first = en.split()[0]
        if first in adverbs and "," not in en and en.endswith("."):
            words = de.split()
            assert words[0] == adverbs[first], (en, de)
            assert words[1] in FINITE, (en, de)
            checked += 1
    assert checked > 200


def test_subordinate_clauses_end_with_the_finite_verb(corpus):
    checked = 0
    for en, de in corpus:
        if ", weil " in de:  # trailing clause: its last word is the finite verb
            assert ", because " in en
            assert de.rstrip(".").split()[-1] in FINITE, (en, de)
            checked += 1
        elif de.startswith("Weil "):  # fronted clause: finite verb before the comma
            assert en.startswith("Because ")
            assert de.split(",")[0].split()[-1] in FINITE, (en, de)
    assert checked > 50


def test_masculine_accusative_and_dative_objects(corpus):
    acc_verbs = {v.en_3sg: "den" for v in LEX.verbs if v.frame == "acc" and v.en != "have"}
    dat_verbs = {v.en_3sg: "dem" for v in LEX.verbs if v.frame == "dat"}
    pattern = re.compile(r"\b(\w+) the (\w+)\b")
    counts = {"den": 0, "dem": 0}
    for en, de in corpus:
        for verb, noun in pattern.findall(en):
            article = {**acc_verbs, **dat_verbs}.get(verb)
            if article and noun in NOUNS and NOUNS[noun].gender == "m":
                assert f"{article} {NOUNS[noun].de}" in de, (en, de)
                counts[article] += 1
    assert counts["den"] > 50 and counts["dem"] > 10


def test_subject_verb_agreement(corpus):
    intransitive = {v.en: v for v in LEX.verbs if v.frame == "intr"}
    by_3sg = {v.en_3sg: v for v in intransitive.values()}
    plural = singular = 0
    for en, de in corpus:
        words = en.rstrip(".?").split()
        if len(words) < 3 or words[0] != "The":
            continue
        if words[1] in NOUNS_PL and words[2] in intransitive:
            noun, verb = NOUNS_PL[words[1]], intransitive[words[2]]
            assert de.startswith(f"Die {noun.de_pl} {verb.de}"), (en, de)
            plural += 1
        elif words[1] in NOUNS and words[2] in by_3sg:
            noun, verb = NOUNS[words[1]], by_3sg[words[2]]
            assert de.startswith(f"{ARTICLE[noun.gender]} {noun.de} {verb.de_3sg}"), (en, de)
            singular += 1
    assert plural > 10 and singular > 30


def test_participles_and_infinitives_go_last(corpus):
    participles = {v.en_part: v.de_part for v in LEX.verbs}
    infinitives = {v.en: v.de for v in LEX.verbs}
    checked = 0
    for en, de in corpus:
        if "," in de or " und " in de or not en.endswith("."):  # one declarative main clause
            continue
        last = de.rstrip(".").split()[-1]
        if m := re.search(r"\b(?:has|have) (\w+)\b", en):
            if m.group(1) in participles:
                assert last == participles[m.group(1)], (en, de)
                checked += 1
        elif m := re.search(r"\b(?:will|can) (\w+)\b", en):
            if m.group(1) in infinitives:
                assert last == infinitives[m.group(1)], (en, de)
                checked += 1
    assert checked > 500


# ---- splits ----------------------------------------------------------------------------------

def test_default_splits_are_disjoint():
    splits = make_splits(seed=0)  # (speed is not a test's business: about 0.7 s on one core)
    assert {k: len(v) for k, v in splits.items()} == {"train": 20000, "valid": 500, "test": 500}
    sources = [{s for s, _ in splits[k]} for k in ("train", "valid", "test")]
    assert sum(map(len, sources)) == 21000  # distinct within and across splits
    assert not (sources[0] & sources[1] or sources[0] & sources[2] or sources[1] & sources[2])


def test_write_splits(tmp_path):
    splits = make_splits(seed=1, n_train=50, n_valid=10, n_test=10)
    paths = write_splits(tmp_path / "toy", splits)
    assert sorted(p.name for p in (tmp_path / "toy").iterdir()) == \
        ["test.de", "test.en", "train.de", "train.en", "valid.de", "valid.en"]
    for name, (src, tgt) in paths.items():
        assert list(read_parallel(src, tgt)) == splits[name]
