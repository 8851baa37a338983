"""Word tables of data/alignments.py read from a real SentencePiece tokenizer."""

from __future__ import annotations

import re

from transduce.data.alignments import word_continuations, word_starts


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text)


def test_a_continuing_piece_glues_to_the_word_before_it(toy_tokenizer):
    """Each piece the table marks joins the word before it in the decoded text (one ``\\w+`` word,
    as a constraint's whole-word check reads it); each unmarked word-start piece begins another."""
    v = toy_tokenizer.tgt_vocab_size
    inside, starts = word_continuations(toy_tokenizer, "tgt", v + 3), word_starts(toy_tokenizer, "tgt", v)
    assert inside.shape == (v + 3,) and not inside[v:].any()              # ids past the vocabulary: never
    pieces = toy_tokenizer.pieces(range(v), "tgt")
    word = next(i for i, p in enumerate(pieces) if starts[i] and len(p) > 2 and p[1:].isalpha())
    marked = [i for i in range(v) if inside[i]]
    assert marked and not (inside[:v] & starts).any()
    for i in marked:
        assert len(_words(toy_tokenizer.decode([word, i], side="tgt"))) == 1, pieces[i]
    for i in range(v):
        if starts[i] and _words(pieces[i][1:]):
            assert len(_words(toy_tokenizer.decode([word, i], side="tgt"))) == 2, pieces[i]
