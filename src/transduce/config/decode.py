"""The decode section: how a sequence-to-sequence model searches for its output."""

from __future__ import annotations

from dataclasses import dataclass

from .base import check, one_of, positive, typecheck


@dataclass(frozen=True)
class DecodeConfig:
    """Search settings. Defaults are the paper's (Sec. 6.1): beam 4, alpha 0.6, max len src+50.

    Saved with a trained model (``decode`` in its config.yaml) and used by ``translate``,
    ``evaluate``, ``serve`` and :class:`~transduce.inference.Translator` unless told otherwise.
    """

    beam: int = 4
    """Beam size K; 1 is greedy search."""
    lenpen: float = 0.6
    """The GNMT length penalty's alpha (Wu et al., 2016, Eq. 14) that ranks finished hypotheses."""
    max_len_a: float = 1.0
    """Output limit ``floor(max_len_a * source_len + max_len_b)`` tokens: the source's factor."""
    max_len_b: int = 50
    """Output limit ``floor(max_len_a * source_len + max_len_b)`` tokens: the constant."""
    min_len: int = 0
    """No EOS before this many output tokens."""
    nbest: int = 1
    """Hypotheses returned per sentence, at most ``beam``."""
    batch_tokens: int = 4096
    """A decoding batch's token budget: sentences x the longest source."""
    max_input_len: int = 1022
    """Source tokens read at most; a longer input is cut (with a warning)."""
    stop: str = "k_finished"
    """When beam search ends a sentence: ``k_finished`` (once K hypotheses have finished, as
    fairseq) or ``best_finished`` (once a step's best extension ended, as CTranslate2); see
    :mod:`transduce.inference.search.beam`."""
    draft_tokens: int = 4
    """With a draft model (speculative decoding): tokens it proposes per step of the model, at most."""
    draft_threshold: float = 0.0
    """With a draft model: it stops proposing in a step once its latest token's probability is
    below this (0: always ``draft_tokens``); the output does not change."""
    no_repeat_ngram_size: int = 0
    """No n-gram of this size appears twice in an output (0: off); as fairseq, HF and CTranslate2
    (:mod:`transduce.inference.search.repetition`)."""
    repetition_penalty: float = 1.0
    """CTRL's repetition penalty (Keskar et al., 2019): the logit of a token already output is
    multiplied by it when negative, divided by it otherwise (1.0: off; > 1 discourages repeats)."""
    rerank: str = "none"
    """How the ``nbest`` hypotheses are reordered: ``none`` (by score), ``mbr`` (minimum Bayes
    risk: by expected ``mbr_utility`` against the others) or ``reverse`` (noisy channel: a
    target->source model's score added, ``reverse_weight`` times; the translator's ``reverse``);
    see :mod:`transduce.inference.search.rerank`."""
    mbr_utility: str = "chrf"
    """With ``rerank: mbr``: the sentence-level utility, ``chrf`` or ``bleu`` (sacrebleu's)."""
    mbr_samples: int = 0
    """With ``rerank: mbr``: the pool is this many samples (ancestral sampling, temperature 1,
    seeds 0, 1, ...; each counted once, as Eikema & Aziz, 2020) instead of the n-best (0)."""
    reverse_weight: float = 1.0
    """With ``rerank: reverse``: the weight of the reverse model's score."""
    shortlist: bool = False
    """Greedy and beam search project onto, and take the softmax over, only the target tokens the
    model directory's vocabulary shortlist lists for the batch's source tokens (``transduce
    shortlist`` builds it; :mod:`transduce.inference.search.shortlist`); a CPU speed-up, off by default."""
    alignment_layer: int = -2
    """Word alignments (``--output-format jsonl``, ``--markup``): the decoder layer whose
    cross-attention aligns, negative from the top; the penultimate by default (the last of a
    one-layer decoder), which aligns best in Garg et al. (2019) and is the one guided alignment
    training supervises; see :mod:`transduce.inference.text.alignment`."""
    alignment_head: int | None = None
    """Word alignments: that layer's head, or the mean over heads (None). Guided alignment training
    (``data.train_alignments``) trains this layer's head, head 0 when this is unset, and the run's
    saved decode settings then name it, so a guided model aligns with its guided head by default."""

    tgt_lang: str | None = None
    """A multilingual model's (``data.pairs``) target language, e.g. ``de``: its tag ``<2de>`` is
    put before each input. None: each input must begin with a tag already; a model trained
    without tags takes none (:func:`transduce.data.multilingual.with_tag`). An imported NLLB or
    M2M-100 model's: a language code (``fra_Latn``, ``fr``), forced as the first output token."""
    src_lang: str | None = None
    """An imported NLLB or M2M-100 model's source language, e.g. ``eng_Latn`` (``en``): its code
    begins each input (:func:`transduce.data.multilingual.code_ids`); such models need it, others
    take none."""

    def __post_init__(self) -> None:
        typecheck(self, "decode")
        check(self.min_len >= 0, "decode.min_len", f"must be >= 0; got {self.min_len}")
        one_of(self.stop, "decode.stop", ("k_finished", "best_finished"))
        one_of(self.rerank, "decode.rerank", ("none", "mbr", "reverse"))
        one_of(self.mbr_utility, "decode.mbr_utility", ("chrf", "bleu"))
        check(self.mbr_samples >= 0, "decode.mbr_samples", f"must be >= 0; got {self.mbr_samples}")
        check(self.rerank == "none" or self.nbest >= 2 or (self.rerank == "mbr" and self.mbr_samples >= 2),
              "decode.rerank", f"reranking chooses among the n-best (or, for mbr, samples); set decode.nbest >= 2 "
                               f"(got {self.nbest}) or decode.mbr_samples >= 2")
        positive(self, "decode", ("beam", "nbest", "batch_tokens", "max_input_len", "draft_tokens"))
        check(0.0 <= self.draft_threshold < 1.0, "decode.draft_threshold",
              f"must be in [0, 1); got {self.draft_threshold}")
        check(self.nbest <= self.beam, "decode.nbest", f"must be <= decode.beam ({self.beam})")
        check(self.no_repeat_ngram_size >= 0, "decode.no_repeat_ngram_size",
              f"must be >= 0 (0: off); got {self.no_repeat_ngram_size}")
        check(self.repetition_penalty > 0, "decode.repetition_penalty",
              f"must be > 0 (1.0: off); got {self.repetition_penalty}")
        check(self.lenpen >= 0, "decode.lenpen", "must be >= 0")
        check(self.max_len_a >= 0 and self.max_len_b >= 0, "decode.max_len_a", "max_len_a/b must be >= 0")
