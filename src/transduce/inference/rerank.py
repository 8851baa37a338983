"""Reranking a sentence's n-best list: minimum Bayes risk (MBR) decoding.

MBR picks the hypothesis with the highest expected utility against the others, each weighted by
its probability renormalised over the list (Kumar & Byrne, 2004,
https://aclanthology.org/N04-1022; over an n-best list as Eikema & Aziz, 2020,
https://arxiv.org/abs/2005.10283, discuss): the consensus translation rather than the single most
probable one. The utility is sentence-level chrF or BLEU from sacrebleu. Each hypothesis keeps
its model score; ``utility`` holds its expected utility.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import sacrebleu

UTILITIES: dict[str, Callable[[str, str], float]] = {
    "chrf": lambda hyp, ref: sacrebleu.sentence_chrf(hyp, [ref]).score,
    "bleu": lambda hyp, ref: sacrebleu.sentence_bleu(hyp, [ref]).score,
}


def expected_utilities(texts: Sequence[str], log_probs: Sequence[float], utility: str) -> list[float]:
    """Each text's expected utility against all of them, weighted by softmax(``log_probs``)."""
    top = max(log_probs)
    weights = [math.exp(lp - top) for lp in log_probs]
    total = sum(weights)
    score = UTILITIES[utility]
    cache: dict[tuple[str, str], float] = {}

    def u(hyp: str, ref: str) -> float:
        if (hyp, ref) not in cache:
            cache[hyp, ref] = score(hyp, ref)
        return cache[hyp, ref]

    return [sum(w * u(hyp, ref) for w, ref in zip(weights, texts)) / total for hyp in texts]


def mbr_rerank(translation, utility: str) -> None:
    """Reorder a :class:`~transduce.inference.translator.Translation`'s hypotheses by expected
    ``utility`` (``chrf`` or ``bleu``), best first, and record it on each (in place)."""
    hyps = translation.hypotheses
    if len(hyps) < 2:
        return
    usable = [h.log_prob if math.isfinite(h.log_prob) else -1e9 for h in hyps]
    for h, value in zip(hyps, expected_utilities([h.text for h in hyps], usable, utility)):
        h.utility = value
    hyps.sort(key=lambda h: -h.utility)
