"""Tokenized, lowercased BLEU as published Multi30k results compute it.

Published Multi30k scores (e.g. 41.0 en->de test_2016 for a text-only Transformer-Tiny) are
BLEU over lowercased, Moses-normalised and Moses-tokenized text: ``normalize-punctuation.perl
-l LANG | tokenizer.perl -l LANG`` with its default HTML escaping (``'`` -> ``&apos;``). The
dataset ships references made exactly that way (``*.lc.norm.tok.LANG``); hypotheses get the
same treatment here (sacremoses, an optional extra), then BLEU runs with no further
tokenisation. This is *not* comparable to sacrebleu's default detokenized BLEU.
"""

from __future__ import annotations

from typing import Sequence

from ..errors import TransduceError


def moses_lc_tokenize(lines: Sequence[str], lang: str) -> list[str]:
    """Lowercase, Moses punctuation normalisation, Moses tokenisation with escaping."""
    try:
        from sacremoses import MosesPunctNormalizer, MosesTokenizer
    except ImportError:
        raise TransduceError("the moses metric needs sacremoses: pip install 'transduce[moses]'") from None
    norm, tok = MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang)
    return [tok.tokenize(norm.normalize(s.lower()), escape=True, return_str=True) for s in lines]


def moses_lc_bleu(hyps: Sequence[str], tokenized_refs: Sequence[str], lang: str,
                  hyps_tokenized: bool = False) -> dict[str, object]:
    """BLEU of detokenized hypotheses against already lowercased+tokenized references.

    ``hyps_tokenized``: the hypotheses are already lowercased and Moses-tokenized (a model trained
    on such text, ``data.corpus=multi30k_tok``) and are scored as they are; tokenizing them again
    would escape their escapes (``&apos;`` -> ``&amp;apos;``).

    Returns ``{"bleu_moses_lc", "bleu_moses_lc_signature"}``.
    """
    import sacrebleu

    if len(hyps) != len(tokenized_refs):
        raise TransduceError(f"{len(hyps)} hypotheses but {len(tokenized_refs)} tokenized references")
    metric = sacrebleu.BLEU(tokenize="none", force=True)
    tokenized = list(hyps) if hyps_tokenized else moses_lc_tokenize(hyps, lang)
    result = metric.corpus_score(tokenized, [list(tokenized_refs)])
    signature = f"moses-lc-{lang}|{metric.get_signature()}"
    return {"bleu_moses_lc": float(result.score), "bleu_moses_lc_signature": signature}
