"""Corpus metrics with sacrebleu (Post, 2018, https://arxiv.org/abs/1804.08771).

The paper reports BLEU (Table 2); we report sacrebleu's detokenized BLEU with its signature
(so numbers are comparable across papers), chrF, and lowercased BLEU; a run's validation takes
its one number, :func:`corpus_bleu`, from here.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from ..config import DecodeConfig
from ..data.corpus import read_lines
from ..errors import DataError
from ..inference.files import reporting
from . import moses
from .significance import compare as paired_significance

if TYPE_CHECKING:
    from ..inference.translator import Translator

logger = logging.getLogger(__name__)


def _check(hyps: Sequence[str], refs: Sequence[str]) -> None:
    if len(hyps) != len(refs):
        raise DataError(f"{len(hyps)} hypotheses but {len(refs)} references")


def corpus_bleu(hyps: Sequence[str], refs: Sequence[str]) -> float:
    """sacrebleu corpus BLEU (default 13a tokenization, case-sensitive), 0-100: validation's one
    number (:func:`score` reports more)."""
    from sacrebleu.metrics import BLEU

    _check(hyps, refs)
    return float(BLEU().corpus_score(list(hyps), [list(refs)]).score)


def classification_scores(predicted: Sequence[str], gold: Sequence[str]) -> dict[str, Any]:
    """Accuracy and macro-F1 (the unweighted mean of each class's F1, over the classes that occur
    in ``gold`` or ``predicted``) of predicted labels against gold ones, and the sentence count."""
    if len(predicted) != len(gold):
        raise DataError(f"{len(predicted)} predictions but {len(gold)} gold labels")
    f1s = []
    for label in sorted(set(gold) | set(predicted)):
        tp = sum(p == g == label for p, g in zip(predicted, gold))
        n_pred, n_gold = sum(p == label for p in predicted), sum(g == label for g in gold)
        f1s.append(2 * tp / (n_pred + n_gold) if n_pred + n_gold else 0.0)
    correct = sum(p == g for p, g in zip(predicted, gold))
    return {"accuracy": correct / max(len(gold), 1), "macro_f1": sum(f1s) / max(len(f1s), 1),
            "sentences": len(gold)}


def score(hyps: Sequence[str], refs: Sequence[str]) -> dict[str, Any]:
    """BLEU, lowercased BLEU and chrF of ``hyps`` against one reference each.

    Returns:
        ``{"bleu", "bleu_signature", "bleu_lowercase", "bleu_lowercase_signature", "chrf",
        "chrf_signature", "bleu_details", "sentences"}``; scores on a 0-100 scale.
    """
    from sacrebleu.metrics import BLEU, CHRF

    _check(hyps, refs)
    hyps, ref_streams = list(hyps), [list(refs)]
    bleu, bleu_lc, chrf = BLEU(), BLEU(lowercase=True), CHRF()
    b = bleu.corpus_score(hyps, ref_streams)
    b_lc = bleu_lc.corpus_score(hyps, ref_streams)
    c = chrf.corpus_score(hyps, ref_streams)
    return {
        "bleu": float(b.score), "bleu_signature": str(bleu.get_signature()),
        "bleu_lowercase": float(b_lc.score), "bleu_lowercase_signature": str(bleu_lc.get_signature()),
        "chrf": float(c.score), "chrf_signature": str(chrf.get_signature()),
        "bleu_details": {"precisions": [float(p) for p in b.precisions], "bp": float(b.bp),
                         "sys_len": int(b.sys_len), "ref_len": int(b.ref_len)},
        "sentences": len(hyps),
    }


def evaluate(translator: "Translator", sources: Sequence[str], references: Sequence[str],
             decode: DecodeConfig | None = None, tok_references: Sequence[str] | None = None,
             lang: str | None = None, hyps_tokenized: bool = False, compare: Sequence[str] | None = None
             ) -> dict[str, Any]:
    """Translate ``sources`` with ``decode`` (default: the translator's settings), score against
    ``references``, and time the translation.

    With ``compare`` (another system's translations of ``sources``), also the paired significance
    of the difference, under ``"compare"`` (:func:`~.significance.compare`).

    With ``tok_references`` (lowercased, Moses-tokenized references, as Multi30k ships) and the
    target ``lang``, also the published-style tokenized BLEU (:mod:`.moses`); ``hyps_tokenized``
    when the model itself writes such text.

    Returns:
        :func:`score`'s dict plus ``seconds``, ``sentences_per_s`` and ``tokens_per_s``
        (generated target tokens, EOS included, per second) and the search settings.
    """
    if len(sources) != len(references):
        raise DataError(f"{len(sources)} source lines but {len(references)} reference lines")
    decode = decode or translator.decode
    if decode.rerank == "none":  # reranking chooses among the n-best
        decode = replace(decode, nbest=1)
    start = time.perf_counter()
    results = translator.translate_detailed(sources, decode, scores=False)  # (texts and lengths read, not scores)
    seconds = time.perf_counter() - start
    tokens = sum(len(r.best.tokens) + int(r.best.ended) for r in results if r.source_tokens)
    out = score([r.best.text for r in results], references)
    if tok_references is not None:
        if lang is None:
            raise DataError("tokenized references need the target language (--lang)")
        out.update(moses.moses_lc_bleu([r.best.text for r in results], tok_references, lang, hyps_tokenized))
    if compare is not None:
        out["compare"] = paired_significance([r.best.text for r in results], compare, references)
    out.update(seconds=round(seconds, 3), sentences_per_s=len(results) / max(seconds, 1e-9),
               tokens_per_s=tokens / max(seconds, 1e-9),
               search={"beam": decode.beam, "lenpen": decode.lenpen, "max_len_a": decode.max_len_a,
                       "max_len_b": decode.max_len_b, "stop": decode.stop})
    logger.info("BLEU %.2f chrF %.2f (%d sentences, %.1f sentences/s)",
                out["bleu"], out["chrf"], len(results), out["sentences_per_s"])
    return out


def evaluate_files(translator: "Translator", src_path: str, ref_path: str, decode: DecodeConfig | None = None,
                   tok_ref_path: str | None = None, lang: str | None = None, hyps_tokenized: bool = False,
                   compare: Sequence[str] | None = None) -> dict[str, Any]:
    """:func:`evaluate` on a source file and a reference file (strict UTF-8, one per line)."""
    sources, references = list(read_lines(src_path)), list(read_lines(ref_path))
    if len(sources) != len(references):
        raise DataError(f"{src_path} has {len(sources)} lines but {ref_path} has {len(references)}")
    tok_refs = list(read_lines(tok_ref_path)) if tok_ref_path is not None else None
    if tok_refs is not None and len(tok_refs) != len(sources):
        raise DataError(f"{tok_ref_path} has {len(tok_refs)} lines but {src_path} has {len(sources)}")

    with reporting(translator, len(sources)):
        return evaluate(translator, sources, references, decode, tok_refs, lang, hyps_tokenized, compare)


def alignment_error_rate(predicted: Sequence[Iterable[tuple[int, int]]], sure: Sequence[Iterable[tuple[int, int]]],
                         possible: Sequence[Iterable[tuple[int, int]]] | None = None) -> float:
    """Och & Ney's (2003) alignment error rate over a corpus of word alignments:
    ``1 - (|A & S| + |A & P|) / (|A| + |S|)``, P including S (``possible`` None: P = S).
    Lower is better; 0 when the links are exactly the sure ones."""
    a_s = a_p = n_a = n_s = 0
    for n, (links, s) in enumerate(zip(predicted, sure)):
        a, s = set(links), set(s)
        p = s | set(possible[n]) if possible is not None else s
        a_s, a_p, n_a, n_s = a_s + len(a & s), a_p + len(a & p), n_a + len(a), n_s + len(s)
    return 1.0 - (a_s + a_p) / (n_a + n_s) if n_a + n_s else 0.0
