"""sacrebleu wrappers: the numbers must be sacrebleu's own."""

from __future__ import annotations

import pytest
import sacrebleu

from transduce.errors import DataError
from transduce.evaluation import corpus_bleu, score

HYPS = ["The cat sat on the mat.", "A dog runs in the park", "the bird sings", "", "Hello world !"]
REFS = ["The cat sat on the mat.", "A dog is running in the park.", "The bird sings a song.",
        "Nothing here.", "Hello, world!"]


def test_corpus_bleu_is_sacrebleus_score():
    assert corpus_bleu(HYPS, REFS) == pytest.approx(sacrebleu.corpus_bleu(HYPS, [REFS]).score)
    assert corpus_bleu(REFS, REFS) == pytest.approx(100.0)
    assert 0.0 < corpus_bleu(HYPS, REFS) < 100.0


def test_score_reports_bleu_chrf_lowercase_and_signatures(tmp_path):
    hyp_file = tmp_path / "hyp.txt"
    hyp_file.write_text("\n".join(HYPS) + "\n", encoding="utf-8")
    hyps = hyp_file.read_text(encoding="utf-8").split("\n")[:-1]
    result = score(hyps, REFS)
    assert result["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [REFS]).score)
    assert result["bleu_lowercase"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [REFS], lowercase=True).score)
    assert result["bleu_lowercase"] > result["bleu"]  # "the bird" vs "The bird"
    assert result["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hyps, [REFS]).score)
    assert "case:mixed" in result["bleu_signature"] and "case:lc" in result["bleu_lowercase_signature"]
    assert result["chrf_signature"].startswith("nrefs:1")
    assert result["sentences"] == len(HYPS)


def test_misaligned_inputs_are_user_errors():
    with pytest.raises(DataError, match="4 hypotheses but 5 references"):
        corpus_bleu(HYPS[:4], REFS)
