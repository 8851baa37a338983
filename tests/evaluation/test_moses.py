"""The Multi30k-style tokenized lowercase BLEU."""

import pytest

from transduce.data.corpus import read_lines
from extra_helpers import need_extra

need_extra("moses", "sacremoses")
from transduce.evaluation.moses import moses_lc_bleu, moses_lc_tokenize  # noqa: E402


def test_escaping_and_lowercasing():
    # normalisation moves the comma
    assert moses_lc_tokenize(["A man's \"Hat\", red."], "en") == ["a man &apos;s &quot; hat , &quot; red ."]


def test_raw_references_score_100_against_official_tokenized_ones(multi30k_root):
    if not (multi30k_root / "tok").is_dir():
        pytest.skip(f"Multi30k's tokenized files are not in {multi30k_root / 'tok'}")
    raw = list(read_lines(multi30k_root / "test_2016_flickr.de.gz"))
    tok = list(read_lines(multi30k_root / "tok" / "test_2016_flickr.lc.norm.tok.de"))
    assert moses_lc_bleu(raw, tok, "de")["bleu_moses_lc"] == pytest.approx(100.0)
    # a degraded hypothesis scores lower
    assert moses_lc_bleu([" ".join(s.split()[:-2]) for s in raw], tok, "de")["bleu_moses_lc"] < 90


def test_tokenized_hypotheses_are_scored_as_they_are():
    refs = ["ein mann &apos;s hut , rot .", "zwei hunde &quot; laufen &quot; ."]
    assert moses_lc_bleu(refs, refs, "de", hyps_tokenized=True)["bleu_moses_lc"] == pytest.approx(100.0)
    # tokenizing them again would escape the escapes
    assert moses_lc_bleu(refs, refs, "de")["bleu_moses_lc"] < 70
