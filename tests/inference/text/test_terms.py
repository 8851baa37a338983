"""Constraints from input lines and glossaries (inference/text/terms.py)."""

from __future__ import annotations

import pytest

from transduce.errors import DataError
from transduce.inference.text.terms import Glossary, Terms


def _glossary(tmp_path, text: str, ignore_case: bool = False) -> Glossary:
    path = tmp_path / "glossary.tsv"
    path.write_text(text, encoding="utf-8")
    return Glossary.load(path, ignore_case)


def test_terms_match_whole_words_in_sequence(tmp_path):
    g = _glossary(tmp_path, "# a comment\n\ndog\tHund\nred dog\troter Hund\ncat\tKatze\n")
    assert g.targets("the red dog runs") == ["roter Hund"]  # the longest term: its "dog" is not "Hund" too
    assert g.targets("a red dog, a dog") == ["Hund", "roter Hund"]
    assert g.targets("the dogs run") == []         # words, not substrings
    assert g.targets("the Dog, a cat.") == ["Katze"]  # case-sensitive by default; punctuation is not a word
    assert _glossary(tmp_path, "dog\tHund\n", ignore_case=True).targets("The DOG") == ["Hund"]


@pytest.mark.parametrize("line", ["dog", "dog\tHund\textra", "\tHund", "dog\t ", "...\tHund"])
def test_a_malformed_glossary_line_is_a_one_line_error(tmp_path, line):
    with pytest.raises(DataError, match=r"glossary.tsv:2: a glossary line is") as e:
        _glossary(tmp_path, f"cat\tKatze\n{line}\n")
    assert "\n" not in str(e.value)


def test_split_input_phrases_and_glossary(tmp_path):
    g = _glossary(tmp_path, "dog\tHund\n")
    assert Terms().split(["a\tb"]) == (["a\tb"], None)  # off: the line is the source
    assert Terms(from_input=True).split(["the dog\tHund\t\t", "tea"]) == (["the dog", "tea"], [["Hund"], []])
    assert Terms(True, g).split(["the dog\tHund", "a dog\tKatze"]) == (["the dog", "a dog"],
                                                                       [["Hund"], ["Katze", "Hund"]])


def test_a_term_given_or_found_twice_is_two_constraints(tmp_path):
    g = _glossary(tmp_path, "dog\tHund\nhound\tHund\nred dog\troter Hund\n")
    assert g.targets("a dog, a dog dog") == ["Hund"] * 3
    assert g.targets("the red dog red dog") == ["roter Hund", "roter Hund"]
    lines = ["a dog and a hound\tHund", "a dog\tHund\tHund\tKatze", "a cat\tHund\tHund", "dog dog"]
    assert Terms(True, g).split(lines)[1] == [["Hund", "Hund"], ["Hund", "Hund", "Katze"], ["Hund", "Hund"],
                                              ["Hund", "Hund"]]
