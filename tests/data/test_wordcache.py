"""The word cache gives exactly SentencePiece's ids, on real text and on text built to break it."""

import gzip
import io
import random
from itertools import chain

import numpy as np
import pytest
import sentencepiece as spm

from transduce.data.tokenizer import Tokenizer
from transduce.data.toy import generate_pairs
from transduce.data.wordcache import WordCache, word_separable

ODD = ["a\xa0b", "  lead and  double  ", "tab\there", "x ¨y z", "ｆｕｌｌ width", "ctrl\x01char", "", " ",
       "\u2581under score", "e\u0301 combining", "Nummer\xa028.", "line\u2028sep", "zero\u200bwidth", "ﬁ ligature",
       "Ⅻ roman", "emoji 🙂 ok", "x\x1cy", "\u3000ideographic", "trailing ", "½ half", "Straße", "İstanbul"]


def _reference(sp, texts):
    rows = sp.encode(list(texts), out_type=int)
    return np.fromiter(chain.from_iterable(rows), np.int32), np.array([len(r) for r in rows])


def _check(tokenizer: Tokenizer, texts, side="src"):
    sp = tokenizer._side(side)
    cache = WordCache(sp)
    want = _reference(sp, texts)
    for _ in range(2):  # cold, then every word cached
        ids, lengths = cache.encode(texts)
        assert np.array_equal(lengths, want[1]) and np.array_equal(ids, want[0])


def _lines(text: str, n: int) -> list[str]:
    return text.splitlines()[:n]


@pytest.fixture(scope="module")
def real_text(multi30k_root):
    pairs = generate_pairs(2000, seed=5)
    texts = [s for s, _ in pairs] + [t for _, t in pairs]
    for lang in ("en", "de", "fr", "cs"):
        texts += _lines(gzip.decompress((multi30k_root / f"train.{lang}.gz").read_bytes()).decode(), 3000)
    return texts


@pytest.mark.parametrize("model_type", ["bpe", "unigram"])
def test_word_at_a_time_equals_sentencepiece(real_text, model_type, tmp_path):
    tok = Tokenizer.train(real_text[::2], real_text[1::2], tmp_path, vocab_size=1000, model_type=model_type)
    rng = random.Random(0)
    odd = [f"{rng.choice(real_text)} {o} {rng.choice(real_text)}" for o in ODD for _ in range(3)]
    mixed = real_text + odd + ODD
    rng.shuffle(mixed)
    _check(tok, mixed)


def test_separate_vocabularies_keep_separate_caches(real_text, tmp_path):
    tok = Tokenizer.train(real_text[:1500], real_text[1500:3000], tmp_path, vocab_size=300, joint=False)
    for side in ("src", "tgt"):
        ids, lengths = tok.encode_flat(real_text[:500] + ODD, side)
        want = _reference(tok._side(side), real_text[:500] + ODD)
        assert np.array_equal(ids, want[0]) and np.array_equal(lengths, want[1])


def test_a_full_cache_still_encodes_exactly(real_text, tmp_path):
    tok = Tokenizer.train(real_text, real_text, tmp_path, vocab_size=500)
    sp = tok._side("src")
    cache = WordCache(sp, limit=50)  # most words never fit: their lines are encoded whole
    ids, lengths = cache.encode(real_text[:800])
    want = _reference(sp, real_text[:800])
    assert len(cache.index) == 50
    assert np.array_equal(ids, want[0]) and np.array_equal(lengths, want[1])
    cache = WordCache(sp, limit=400)  # room for a batch's words, not for the corpus': it starts over
    for lo in range(0, 800, 100):
        ids, lengths = cache.encode(real_text[lo:lo + 100])
        want = _reference(sp, real_text[lo:lo + 100])
        assert np.array_equal(ids, want[0]) and np.array_equal(lengths, want[1])
        assert len(cache.index) <= 400


@pytest.mark.parametrize("option", [{}, {"split_by_whitespace": False}, {"remove_extra_whitespaces": False},
                                    {"treat_whitespace_as_suffix": True}, {"add_dummy_prefix": False}])
def test_models_that_join_words_are_encoded_a_line_at_a_time(real_text, option):
    buffer = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(real_text[:3000]), model_writer=buffer, vocab_size=300,
                                   pad_id=0, bos_id=1, eos_id=2, unk_id=3, minloglevel=2, **option)
    tok = Tokenizer(buffer.getvalue())
    assert word_separable(tok._side("src")) == (option == {})
    texts = real_text[:400] + ["two  spaces here", "  lead"]
    ids, lengths = tok.encode_flat(texts, "src")
    want = _reference(tok._side("src"), texts)
    assert np.array_equal(ids, want[0]) and np.array_equal(lengths, want[1])
