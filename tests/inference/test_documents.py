"""Document translation: paragraphs and blank lines kept exactly, sentences batched in one call,
over-long sentences cut (never truncated), the sentence splitter's edge cases."""

from __future__ import annotations

import logging
import random
from collections import Counter

import pytest

from extra_helpers import need_extra
from toy_model import WORDS
from transduce.cli import main
from transduce.inference import Translator
from transduce.inference.documents import (fit, split_blocks, split_paragraph, split_sentences, translate_document,
                                           translate_document_file)
from transduce.inference.text.markup import TOKEN
from transduce.inference.translator import input_limit

need_extra("documents", "sentencex")


@pytest.fixture(scope="module")
def translator(trained_dir):
    with Translator.load(trained_dir) as tr:
        yield tr


def _sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 6))) + rng.choice([".", "!", "?"])


def generated_document(n_paragraphs: int, seed: int = 0) -> tuple[str, int]:
    """Paragraphs of 1-20 sentences (some over several lines), separated by 1-3 blank lines
    (some holding spaces), with leading blank lines and indented paragraphs; and the number of
    sentences."""
    rng = random.Random(seed)
    parts, n = ["", "  "], 0
    for i in range(n_paragraphs):
        sentences = [_sentence(rng) for _ in range(rng.randint(1, 20))]
        n += len(sentences)
        gaps = [rng.choice([" ", " ", "  ", "\n"]) for _ in sentences[1:]] + [""]
        parts.append(rng.choice(["", "", "   "]) + "".join(s + g for s, g in zip(sentences, gaps)))
        if i < n_paragraphs - 1:
            parts.extend(rng.choice(["", "", " \t"]) for _ in range(rng.randint(1, 3)))
    return "\n".join(parts), n


def test_a_200_paragraph_document_keeps_its_shape_and_each_sentence_translates_alone(translator):
    text, n_sentences = generated_document(200)
    decode = translator.settings(beam=1)
    calls = []
    translate = translator.translate
    translator.translate = lambda sources, d, markup: calls.append(len(sources)) or translate(sources, d, markup=markup)
    try:
        out = translate_document(translator, text, decode)
    finally:
        del translator.translate
    blocks, out_blocks = split_blocks(text), split_blocks(out)
    assert sum(isinstance(b, list) for b in out_blocks) == 200
    assert [b for b in blocks if isinstance(b, str)] == [b for b in out_blocks if isinstance(b, str)]
    assert len(calls) == 1  # the whole document is one batched call
    limit = input_limit(translator.config, decode.max_input_len)

    def count(s):
        return len(translator.tokenizer.encode(s, side="src"))

    paragraphs = [split_paragraph(b, "en", limit, count) for b in blocks if isinstance(b, list)]
    assert [p.source() for p in paragraphs] == ["\n".join(b) for b in blocks if isinstance(b, list)]
    assert calls[0] == sum(len(p.pieces) for p in paragraphs)  # every piece, in the one call
    assert calls[0] > 0.95 * n_sentences  # the splitter reads a few "... a. next" as an initial, like "J. Smith"
    alone = {s: translator.translate([s], decode)[0] for p in paragraphs[:10] for s in p.pieces}
    want = [p.joined([alone[s] for s in p.pieces]) for p in paragraphs[:10]]
    got = ["\n".join(b) for b in out_blocks if isinstance(b, list)][:10]
    assert got == want


def test_a_paragraph_ten_times_the_limit_is_translated_whole(translator, caplog):
    rng = random.Random(3)
    words = [rng.choice(WORDS) for _ in range(200)]
    paragraph = " ".join(w + ("," if i % 37 == 36 else "") for i, w in enumerate(words))  # one sentence
    decode = translator.settings(beam=1, max_input_len=16)

    def count(s):
        return len(translator.tokenizer.encode(s, side="src"))

    assert count(paragraph) >= 10 * 16
    para = split_paragraph([paragraph], "en", 16, count)
    assert para.source() == paragraph and all(0 < count(p) <= 16 for p in para.pieces)
    with caplog.at_level(logging.WARNING, logger="transduce"):
        out = translate_document(translator, paragraph, decode)
    assert "truncated" not in caplog.text
    assert out == para.joined(translator.translate(para.pieces, decode))
    assert len(out.split()) >= 0.8 * len(words)  # the toy model translates word for word


@pytest.mark.parametrize("text, want", [
    ("Dr. Smith paid $3.50 for it. Then he left.", ["Dr. Smith paid $3.50 for it. ", "Then he left."]),
    ('He said "Stop." She did not.', ['He said "Stop." ', "She did not."]),
    ("The U.S. economy grew 2.5% in Q3. Really?  Yes!", ["The U.S. economy grew 2.5% in Q3. ", "Really?  ",
                                                         "Yes!"]),
    ("Version 1.2.3 is out", ["Version 1.2.3 is out"]),
    ("They <b>love birds.</b> Birds sing.", ["They <b>love birds.</b> ", "Birds sing."]),  # not "</b> Birds"
    ("<p>A cat eats.</p> <p>It sleeps.</p>", ["<p>A cat eats.</p> ", "<p>It sleeps.</p>"]),
    ("It ends.<br/> Next one.", ["It ends.", "<br/> Next one."]),  # only closing tags go back
])
def test_the_splitter_keeps_abbreviations_numbers_and_quotes(text, want):
    assert split_sentences(text) == want
    assert "".join(split_sentences(text)) == text


def test_fit_cuts_at_punctuation_then_whitespace_then_characters():
    def count(s):
        return len(s.split())

    assert fit("a b, c d, e f", 4, count) == ["a b, c d, ", "e f"]
    assert fit("a b c d e", 2, count) == ["a b ", "c d ", "e"]

    def chars(s):
        return len(s)

    assert "".join(fit("abcdefgh ij", 3, chars)) == "abcdefgh ij"
    assert all(len(p.strip()) <= 3 for p in fit("abcdefgh ij", 3, chars))


@pytest.mark.parametrize("text", ["", "\n", " \n\n\t", "\n\nthe dog runs.\n\n"])
def test_empty_and_blank_documents_keep_every_line(translator, text):
    out = translate_document(translator, text, beam=1)
    assert out.count("\n") == text.count("\n")
    assert [b for b in split_blocks(out) if isinstance(b, str)] == [b for b in split_blocks(text)
                                                                    if isinstance(b, str)]


def test_cli_translates_a_document_file(trained_dir, translator, tmp_path):
    text, _ = generated_document(5, seed=4)
    src, out = tmp_path / "doc.txt", tmp_path / "doc.de"
    src.write_text(text + "\n", encoding="utf-8")
    assert main(["translate", str(trained_dir), "--documents", "--input", str(src), "--output", str(out),
                 "--beam", "1", "--device", "cpu"]) == 0
    assert out.read_text(encoding="utf-8") == translate_document(translator, text, beam=1) + "\n"
    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    assert translate_document_file(translator, empty, tmp_path / "empty.de") == 0
    assert (tmp_path / "empty.de").read_text(encoding="utf-8") == ""


def test_cli_refuses_line_options_with_documents(trained_dir, tmp_path, capsys):
    src = tmp_path / "doc.txt"
    src.write_text("the dog runs.\n", encoding="utf-8")
    assert main(["translate", str(trained_dir), "--documents", "--input", str(src), "--nbest", "2"]) != 0
    err = capsys.readouterr().err.strip()
    assert "--nbest" in err and "\n" not in err


# A document with markup as its blocks: a paragraph (a tuple) is its sentences, each with the
# whitespace after it, as the splitter must cut it; a blank line is a str. A tag inside a sentence,
# one over words, one closing after the full stop, a placeholder, several sentences a paragraph
# (over two lines), a paragraph without tags.
MARKED_DOCUMENT = [
    ("The <b>old dog</b> sees the cat. ", "A bird sings."),
    " \t",
    ("  The dog <i>runs.</i>  ", "The cat sleeps.\n", "The <u>red bird</u> sings {name}."),
    "",
    ("The river is near the tree.  ", "A house is big."),
    ("<p>The small cat eats.</p> ", "<p>The bird sings.</p>"),
]


def _sentences(paragraph: tuple[str, ...]) -> list[tuple[str, str]]:
    """A paragraph's sentences as (sentence, the whitespace after it); the paragraph's leading
    whitespace as a first ("", lead)."""
    lead = paragraph[0][: len(paragraph[0]) - len(paragraph[0].lstrip())]
    return [("", lead)] + [(s.strip(), s[len(s.rstrip()):]) for s in paragraph]


def marked_document() -> tuple[str, list[tuple[str, str] | str]]:
    """The document's text; per block, its sentences with their separators or the blank line."""
    blocks = [b if isinstance(b, str) else _sentences(b) for b in MARKED_DOCUMENT]
    text = "\n".join(b if isinstance(b, str) else "".join(s + g for s, g in b) for b in blocks)
    return text, blocks


def test_documents_with_markup_are_markup_on_each_sentence_joined_as_the_source(trained_dir, translator, tmp_path):
    text, blocks = marked_document()
    alone = {s: translator.translate([s], beam=1, markup=True)[0] for b in blocks if isinstance(b, list)
             for s, _ in b if s}
    want = "\n".join(b if isinstance(b, str) else "".join((alone[s] if s else "") + g for s, g in b) for b in blocks)
    assert Counter(m.group(0) for m in TOKEN.finditer(want)) == Counter(m.group(0) for m in TOKEN.finditer(text))
    assert translate_document(translator, text, beam=1, markup=True) == want
    src, out = tmp_path / "doc.html", tmp_path / "doc.de"
    src.write_text(text + "\n", encoding="utf-8")
    assert main(["translate", str(trained_dir), "--documents", "--markup", "--input", str(src), "--output", str(out),
                 "--beam", "1", "--device", "cpu"]) == 0
    assert out.read_text(encoding="utf-8") == want + "\n"
