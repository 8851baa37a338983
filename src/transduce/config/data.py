"""The data section: where the text comes from and how it becomes batches."""

from __future__ import annotations

from dataclasses import dataclass

from .base import check, one_of, positive, typecheck
from .clean import normalise_clean
from .pairs import normalise_pairs

TOY_SEED = 0  # the toy corpus is one corpus: the demo, the tests and the docs' numbers are of it


@dataclass(frozen=True)
class DataConfig:
    """Where the text comes from, how it is tokenized and filtered, and how it becomes batches.

    Which side a task reads: translation both; a language model (``train.task: lm``) the target
    side, a masked LM (``mlm``) the source side (``reverse`` swaps them), or monolingual
    ``*_tgt`` files for either; classification (``classify``) ``text<TAB>label`` lines in the
    ``*_src`` files.
    """

    corpus: str = "toy"
    """``toy`` (the embedded generated pair, no download); ``multi30k`` (raw files under ``root``);
    ``multi30k_tok`` (the same corpus's lowercased, Moses-tokenized text in ``root/tok/``, which
    published Multi30k systems train on; the model then writes lowercased tokenized text);
    ``files`` (the ``train_src``/``train_tgt``/... paths); or ``tsv`` (text-to-text, T5's
    multi-task fine-tuning: the ``*_src`` files hold ``input<TAB>target`` lines, each input
    starting with its task's prefix, e.g. ``translate English to German: ...``; validation then
    scores each task, see :mod:`transduce.evaluation.text2text`; ``max_ratio`` does not apply)."""
    root: str | None = None
    """The Multi30k directory; None: $TRANSDUCE_MULTI30K."""
    src_lang: str = "en"
    """The source language's code, as the corpus names it."""
    tgt_lang: str = "de"
    """The target language's code, as the corpus names it."""
    train_src: str | None = None
    """Training source text, one sentence a line (``corpus: files``). For ``train.task: classify``:
    ``text<TAB>label`` (or sentence pairs' ``text_a<TAB>text_b<TAB>label``) lines, read with an
    existing tokenizer (:mod:`transduce.data.labelled`)."""
    train_tgt: str | None = None
    """Training target text, line-aligned with ``train_src``. Without ``*_src`` files, monolingual
    text for a language model or masked LM (each line is stored as both sides of a pair)."""
    train_alignments: str | None = None
    """Word alignments of the training pairs for guided alignment training (Marian's
    ``--guided-alignment``): Pharaoh ``i-j`` links (source word i, target word j, whitespace-separated
    words numbered from 0; fast_align's or eflomal's output), one line per pair of the training
    split as written (before ``reverse``), stored with the prepared pairs (data/alignments.py);
    ``train.guided_alignment_weight`` weighs the loss, ``decode.alignment_layer``/``alignment_head``
    name the head it trains."""
    valid_src: str | None = None
    """Validation source text (``corpus: files``)."""
    valid_tgt: str | None = None
    """Validation target text (``corpus: files``)."""
    test_src: str | None = None
    """Test source text (``corpus: files``)."""
    test_tgt: str | None = None
    """Test target text (``corpus: files``)."""
    toy_train_size: int = 20000
    """Sentence pairs in the toy training split."""
    toy_valid_size: int = 500
    """Sentence pairs in the toy validation split."""
    toy_test_size: int = 500
    """Sentence pairs in the toy test split."""
    vocab_size: int = 8000
    """Pieces in each tokenizer model trained (at least 8)."""
    sentinels: int = 0
    """T5's sentinels ``<extra_id_N>`` reserved at the end of each tokenizer model trained (within
    ``vocab_size``; ``<extra_id_0>`` is the last id, as in T5), which ``train.task: span``
    replaces dropped spans with: at least as many as a sentence of ``max_len`` has spans."""
    tokenizer_algorithm: str = "bpe"
    """The algorithm of each tokenizer model trained (SentencePiece's model type): ``bpe`` or
    ``unigram`` (an older config's ``tokenizer_type``)."""
    joint_vocab: bool = True
    """One tokenizer model for both sides (a joint vocabulary), not one per side."""
    max_len: int = 250
    """Training pairs with a side of more tokens are dropped."""
    max_ratio: float = 3.0
    """Training pairs whose longer side has more than this many times the tokens of the shorter
    are dropped."""
    max_tokens: int = 4096
    """A training batch's token budget: sentences x the longest padded side (data/epoch_batches.py)."""
    valid_max_sentences: int | None = None
    """Validation pairs used at most (the first ones); None: all. Applied when training starts, not
    when preparing: one prepared directory serves any value, and changing it needs no new prepare."""
    reverse: bool = False
    """Train the other direction: every split's pairs are swapped after reading, so ``src_lang``,
    ``train_src``... keep naming the corpus as written."""
    bpe_dropout: float = 0.0
    """BPE-dropout (Provilkov et al., 2020): > 0 re-segments the training text of
    ``bpe_dropout_sides`` at random every epoch, each merge skipped with this probability;
    validation, test and inference use the usual segmentation."""
    bpe_dropout_sides: str = "both"
    """Which sides BPE-dropout re-segments: ``src``, ``tgt`` or ``both``."""
    tokenizer: str | None = None
    """An existing tokenizer directory to reuse instead of training one."""
    tokenizer_sentences: int = 1_000_000
    """Lines per side in the seeded sample a new tokenizer is trained on."""
    prepared: str | None = None
    """A directory made by ``transduce prepare`` to train from; the corpus, tokenizer and filter
    settings are then the ones it was prepared with (its ``manifest.json``)."""

    pairs: list | None = None
    """Multilingual training (``data.corpus: multi30k`` or ``multi30k_tok``): the language pairs
    of one model, each ``{src: en, tgt: de, weight: 1.0}`` (``weight`` optional) or ``en-de``.
    Each source is prefixed with its target language's tag ``<2de>`` (a piece of its own in the
    joint vocabulary); training draws each epoch's pairs per ``weight`` (given for all or none)
    or else ``pair_temperature``; validation scores each pair (``val_bleu/en-de``). Replaces
    ``src_lang``/``tgt_lang``; see :mod:`transduce.data.multilingual`."""
    pair_temperature: float = 1.0
    """Without weights: pair i is drawn with probability proportional to n_i^(1/T) (n_i its
    training pairs): 1 is proportional to size, larger values flatten towards uniform."""
    clean: dict | None = None
    """Clean the training pairs on the way in (``prepare``, ``train``), as ``transduce clean``
    does: duplicates, the wrong language, copies, debris... (:class:`~transduce.config.clean.CleanConfig`
    lists the rules and their settings; ``{}``: every rule at its default; None: no cleaning). The
    per-rule counts go to the prepared manifest; see docs/guides/cleaning.md."""

    def __post_init__(self) -> None:
        typecheck(self, "data")
        one_of(self.corpus, "data.corpus", ("toy", "multi30k", "multi30k_tok", "files", "tsv"))
        one_of(self.tokenizer_algorithm, "data.tokenizer_algorithm", ("bpe", "unigram"))
        positive(self, "data", ("toy_train_size", "toy_valid_size", "toy_test_size", "vocab_size", "max_len",
                                "max_tokens", "tokenizer_sentences"))
        check(self.vocab_size >= 8, "data.vocab_size", "must be at least 8")
        check(0 <= self.sentinels <= self.vocab_size - 8, "data.sentinels",
              f"must be in [0, data.vocab_size - 8]; got {self.sentinels}")
        check(self.max_ratio >= 1.0, "data.max_ratio", f"must be >= 1; got {self.max_ratio}")
        check(0.0 <= self.bpe_dropout < 1.0, "data.bpe_dropout", f"must be in [0, 1); got {self.bpe_dropout}")
        one_of(self.bpe_dropout_sides, "data.bpe_dropout_sides", ("src", "tgt", "both"))
        check(self.bpe_dropout == 0.0 or self.tokenizer_algorithm == "bpe", "data.bpe_dropout",
              "needs data.tokenizer_algorithm=bpe")
        if self.corpus == "tsv":
            self._check_tsv()
        check(self.pair_temperature > 0, "data.pair_temperature", f"must be > 0; got {self.pair_temperature}")
        if self.pairs is not None:
            object.__setattr__(self, "pairs", normalise_pairs(self))
        if self.clean is not None:
            object.__setattr__(self, "clean", normalise_clean(self))
        if self.corpus == "files" and self.prepared is None:
            check(self.train_src is not None or self.train_tgt is not None, "data.train_tgt",
                  "is required when data.corpus=files (with data.train_src, except for a language model's "
                  "monolingual text; train.task classify reads data.train_src alone)")
        check(self.train_alignments is None or self.prepared is None, "data.train_alignments",
              "is read when the data is prepared; data.prepared was prepared with its alignments or without")

    def _check_tsv(self) -> None:
        check(self.train_src is not None or self.prepared is not None, "data.train_src",
              "is required when data.corpus=tsv (input<TAB>target lines)")
        check(all(getattr(self, f"{k}_tgt") is None for k in ("train", "valid", "test")), "data.train_tgt",
              "data.corpus=tsv reads input and target from the data.*_src files (input<TAB>target); set no *_tgt")
        check(not self.reverse, "data.reverse", "does not apply to data.corpus=tsv (its lines say which side is which)")

    @property
    def toy_seed(self) -> int:
        """The toy corpus generator's seed: always :data:`TOY_SEED` (no config changed it; an older
        config's ``data.toy_seed: 0`` is read and dropped)."""
        return TOY_SEED

    @property
    def ratio_limit(self) -> float:
        """The length ratio above which a training pair is dropped: ``max_ratio``, or none for
        text-to-text (a classification target is a word or two)."""
        return float("inf") if self.corpus == "tsv" else self.max_ratio

    @property
    def labelled(self) -> bool:
        """Whether the files are text<TAB>label lines (train.task classify): ``*_src`` without ``*_tgt``."""
        return self.corpus == "files" and self.train_src is not None and self.train_tgt is None
