"""Reranking a sentence's n-best list: minimum Bayes risk (MBR) decoding, or a reverse model's
score added (noisy channel).

MBR picks the hypothesis with the highest expected utility against the others, each weighted by
its probability renormalised over the list (Kumar & Byrne, 2004,
https://aclanthology.org/N04-1022; over an n-best list as Eikema & Aziz, 2020,
https://arxiv.org/abs/2005.10283, discuss): the consensus translation rather than the single most
probable one. The utility is sentence-level chrF or BLEU from sacrebleu. Each hypothesis keeps
its model score; ``utility`` holds its expected utility.

The noisy-channel reranking (Yee et al., 2019, https://arxiv.org/abs/1908.05731) adds to each
hypothesis' score ``reverse_weight`` times a target->source model's length-normalised score of
the source given the hypothesis (forced decoding, :mod:`~transduce.inference.scoring`); the sum is
its ``utility``.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

from ...config import DecodeConfig
from ...errors import ConfigError

def _chrf(hyp: str, ref: str) -> float:
    import sacrebleu  # (imported when reranking: it costs ~0.1 s of every translate's start-up)
    return sacrebleu.sentence_chrf(hyp, [ref]).score


def _bleu(hyp: str, ref: str) -> float:
    import sacrebleu
    return sacrebleu.sentence_bleu(hyp, [ref]).score


UTILITIES: dict[str, Callable[[str, str], float]] = {"chrf": _chrf, "bleu": _bleu}


def expected_utilities(texts: Sequence[str], log_probs: Sequence[float] | None, utility: str) -> list[float]:
    """Each text's expected utility against all of them, weighted by softmax(``log_probs``), or
    equally (None: samples, whose frequencies are the weights)."""
    top = max(log_probs) if log_probs is not None else 0.0
    weights = [math.exp(lp - top) for lp in log_probs] if log_probs is not None else [1.0] * len(texts)
    total = sum(weights)
    score = UTILITIES[utility]
    cache: dict[tuple[str, str], float] = {}

    def u(hyp: str, ref: str) -> float:
        if (hyp, ref) not in cache:
            cache[hyp, ref] = score(hyp, ref)
        return cache[hyp, ref]

    return [sum(w * u(hyp, ref) for w, ref in zip(weights, texts)) / total for hyp in texts]


def mbr_rerank(translation, utility: str, samples: bool = False) -> None:
    """Reorder a :class:`~transduce.inference.translator.Translation`'s hypotheses by expected
    ``utility`` (``chrf`` or ``bleu``), best first, and record it on each (in place). ``samples``:
    the hypotheses are samples, weighted equally; a text drawn twice is then kept once."""
    hyps = translation.hypotheses
    if len(hyps) < 2:
        return
    usable = None if samples else [h.log_prob if math.isfinite(h.log_prob) else -1e9 for h in hyps]
    for h, value in zip(hyps, expected_utilities([h.text for h in hyps], usable, utility)):
        h.utility = value
    hyps.sort(key=lambda h: -h.utility)
    seen: set[str] = set()
    translation.hypotheses = [h for h in hyps if not (h.text in seen or seen.add(h.text))]


def reverse_rerank(translations: Sequence, reverse, decode: DecodeConfig) -> None:
    """Reorder each translation's hypotheses by score + ``decode.reverse_weight`` x the
    ``reverse`` translator's (a target->source model) score of the source given the hypothesis,
    best first, and record that sum as each one's ``utility`` (in place)."""
    if reverse is None:
        raise ConfigError("decode.rerank: reverse needs a target->source model (the translator's reverse, "
                          "e.g. decode.rerank=reverse:DIR)")
    pairs = [(t, h) for t in translations for h in t.hypotheses if t.source_tokens]
    scored = reverse.score([h.text for _, h in pairs], [t.source for t, _ in pairs], lenpen=decode.lenpen)
    for (_, h), s in zip(pairs, scored):
        h.utility = h.score + decode.reverse_weight * s.score
    for t in translations:
        if t.source_tokens:
            t.hypotheses.sort(key=lambda h: -h.utility)
