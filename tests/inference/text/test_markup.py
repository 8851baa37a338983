"""Markup kept through translation: tags out, back in at aligned positions (pure text, no model)."""

import random
import re
import xml.etree.ElementTree as ET
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transduce.inference.text.markup import TOKEN, restore_markup, strip_markup


def tags(text: str) -> Counter:
    return Counter(m.group(0) for m in TOKEN.finditer(text))


def well_formed(text: str) -> bool:
    body = re.sub(r"\{[A-Za-z_][\w.]*\}|https?://[^\s<>]+", "X", text).replace("&", "&amp;")
    try:
        ET.fromstring(f"<root>{body}</root>")
    except ET.ParseError:
        return False
    return True


def reversed_translation(text: str) -> tuple[str, list[tuple[int, int]]]:
    """A 'translation' that reverses the words, and its alignment."""
    words = text.split()
    n = len(words)
    return " ".join(reversed(words)), [(i, n - 1 - i) for i in range(n)]


@pytest.mark.parametrize("text, plain", [
    ("A <b>big dog</b> runs.<br/>", "A big dog runs."),
    ('Hi {name}, see https://x.org/a?b=1 <a href="u">now</a>', "Hi , see now"),
    ("<p><b>x</b> y <i>z</i></p>", "x y z"),
])
def test_strip_then_identity_restore_gives_the_input_back(text, plain):
    s = strip_markup(text)
    assert s.text == plain and s.n_words == len(plain.split())
    out = restore_markup(s, s.text, [(i, i) for i in range(s.n_words)])
    assert tags(out) == tags(text) and well_formed(out)
    assert re.sub(r"\s+", "", out) == re.sub(r"\s+", "", text)  # same order, spacing aside


def test_tags_follow_the_alignment_when_words_move():
    s = strip_markup("the <b>red</b> car <br/> stops")
    # "das Auto rot hält": the -> das, red -> rot, car -> Auto, stops -> hält
    out = restore_markup(s, "das Auto rot hält", [(0, 0), (1, 2), (2, 1), (3, 3)])
    assert out == "das Auto <b>rot</b> <br/> hält"


def test_an_element_over_several_words_wraps_from_the_first_aligned_to_the_last():
    s = strip_markup("<i>a b</i> c")
    assert restore_markup(s, "x y z", [(0, 2), (1, 1), (2, 0)]) == "x <i>y z</i>"


def test_unaligned_element_is_kept_not_dropped():
    s = strip_markup("a <b>b</b> c")
    out = restore_markup(s, "x y", [(0, 0), (2, 1)])
    assert tags(out) == tags("a <b>b</b> c") and well_formed(out)


def test_text_without_markup_is_returned_as_is():
    s = strip_markup("plain  text, a < b")
    assert s.elements == [] and s.text == "plain  text, a < b"
    assert restore_markup(s, "some translation", [(0, 0)]) == "some translation"


@pytest.mark.parametrize("text", ["</i> a <b> b <u>c</b> d", "a <b>b", "<b><i>x</b></i>", "</b>"])
def test_tags_that_are_not_well_formed_are_kept_standalone(text):
    s = strip_markup(text)
    src, links = reversed_translation(s.text)
    out = restore_markup(s, src, links)
    assert tags(out) == tags(text)


def test_an_unclosed_tag_keeps_its_content_after_it():
    s = strip_markup("a <b>b <i>c</i>")
    out = restore_markup(s, s.text, [(i, i) for i in range(s.n_words)])
    assert out == "a <b> b <i>c</i>"


_words = st.lists(st.sampled_from(["w", "x", "y", "z"]), min_size=0, max_size=3).map(" ".join)


@st.composite
def documents(draw, depth: int = 0) -> str:
    """Random well-formed markup: text, nested elements, standalone tags, placeholders."""
    parts = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["text", "element", "point"] if depth < 3 else ["text", "point"]))
        if kind == "text":
            parts.append(draw(_words))
        elif kind == "point":
            parts.append(draw(st.sampled_from(["<br/>", "{name}", "https://a.b/c", "<img src='x'/>"])))
        else:
            name = draw(st.sampled_from(["b", "i", "span"]))
            parts.append(f"<{name}>{draw(documents(depth + 1))}</{name}>")
    return " ".join(parts)


@settings(max_examples=200, deadline=None)
@given(documents(), st.integers(0, 2**16))
def test_any_alignment_keeps_the_tags_and_well_formedness(text, seed):
    s = strip_markup(text)
    rng = random.Random(seed)
    m = rng.randint(0, s.n_words + 2)
    translation = " ".join(f"t{j}" for j in range(m))
    links = [(rng.randrange(s.n_words), rng.randrange(m)) for _ in range(rng.randint(0, 6))] if s.n_words and m else []
    out = restore_markup(s, translation, links)
    assert tags(out) == tags(text)
    assert well_formed(out)
    assert [w for w in TOKEN.sub(" ", out).split()] == translation.split()  # words untouched, in order


def test_a_leading_target_language_tag_is_no_markup_and_no_word():
    """``<2de>`` first on a line (a multilingual model's tag) stays first in the plain text and the
    words are counted after it, so the alignment of the text without it puts the tags back."""
    stripped = strip_markup("<2de> the <b>red</b> dog", lead={"<2de>", "<2fr>"})
    assert stripped.text == "<2de> the red dog" and stripped.n_words == 3
    assert restore_markup(stripped, "the red dog", [(0, 0), (1, 1), (2, 2)]) == "the <b>red</b> dog"
    assert strip_markup("<2de> the dog", lead={"<2de>"}).text == "<2de> the dog"   # no markup: as is
    assert strip_markup("<2de>", lead={"<2de>"}).text == "<2de>"
    assert strip_markup("<2xx> the <b>dog</b>", lead={"<2de>"}).text == "<2xx> the dog"  # not a tag of the model
