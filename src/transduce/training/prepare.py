"""From a :class:`~transduce.config.DataConfig` to what a run trains on: text pairs for each
split, a tokenizer (trained once and cached in the run directory), and encoded pairs."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from ..config import DataConfig
from ..data import toy
from ..data.corpus import filter_and_encode, read_parallel
from ..data.tokenizer import Tokenizer
from ..errors import DataError

logger = logging.getLogger(__name__)

Pair = tuple[list[int], list[int]]
TextPair = tuple[str, str]


@dataclass
class Splits:
    """Raw text pairs of each split (valid/test may be empty)."""

    train: list[TextPair]
    valid: list[TextPair]
    test: list[TextPair]


@dataclass
class PreparedData:
    """``train_texts[i]`` is the text of ``train[i]`` (the kept training pairs)."""

    tokenizer: Tokenizer
    train: list[Pair]
    valid: list[Pair]
    texts: Splits
    train_texts: list[TextPair]


def _read(src: str | os.PathLike | None, tgt: str | os.PathLike | None) -> list[TextPair]:
    if src is None or tgt is None:
        return []
    return list(read_parallel(src, tgt))


def load_splits(cfg: DataConfig) -> Splits:
    """Read (or, for the toy corpus, generate) the text of every split; swapped if ``reverse``."""
    splits = _load_splits(cfg)
    if not cfg.reverse:
        return splits
    return Splits(*([(t, s) for s, t in pairs] for pairs in (splits.train, splits.valid, splits.test)))


def _load_splits(cfg: DataConfig) -> Splits:
    if cfg.corpus == "toy":
        s = toy.make_splits(seed=cfg.toy_seed, n_train=cfg.toy_train_size, n_valid=cfg.toy_valid_size,
                            n_test=cfg.toy_test_size)
        return Splits(s["train"], s["valid"], s["test"])
    if cfg.corpus in ("multi30k", "multi30k_tok"):
        from ..data import multi30k
        root = cfg.root or multi30k.default_root()
        if root is None:
            raise DataError("data.root is not set and $TRANSDUCE_MULTI30K is empty: "
                            "where are the Multi30k files? (transduce data multi30k --dest DIR)")
        return Splits(*(multi30k.read_split(root, split, cfg.src_lang, cfg.tgt_lang, cfg.corpus == "multi30k_tok")
                        for split in ("train", "val", "test_2016_flickr")))
    return Splits(_read(cfg.train_src, cfg.train_tgt), _read(cfg.valid_src, cfg.valid_tgt),
                  _read(cfg.test_src, cfg.test_tgt))


def load_or_train_tokenizer(cfg: DataConfig, train: list[TextPair], directory: Path, seed: int) -> Tokenizer:
    """The run's tokenizer: loaded from ``directory`` if present, else trained there."""
    if Tokenizer.exists(directory):
        return Tokenizer.load(directory)
    logger.info("training a %s tokenizer (vocab %d, %s) on %d pairs", cfg.tokenizer_type, cfg.vocab_size,
                "joint" if cfg.joint_vocab else "separate", len(train))
    return Tokenizer.train((s for s, _ in train), (t for _, t in train), directory, cfg.vocab_size,
                           model_type=cfg.tokenizer_type, joint=cfg.joint_vocab, seed=seed)


def prepare(cfg: DataConfig, run_dir: Path, seed: int = 0) -> PreparedData:
    """Text, tokenizer and filtered token ids for a run rooted at ``run_dir``."""
    texts = load_splits(cfg)
    if not texts.train:
        raise DataError("the training corpus is empty")
    if cfg.valid_max_sentences is not None:
        texts.valid = texts.valid[: cfg.valid_max_sentences]
    tokenizer = load_or_train_tokenizer(cfg, texts.train, run_dir / "tokenizer", seed)
    train_texts: list[TextPair] = []
    train, stats = filter_and_encode(texts.train, tokenizer, cfg.max_len, cfg.max_ratio, train_texts)
    logger.info("train: %s", stats.summary())
    valid, vstats = filter_and_encode(texts.valid, tokenizer, cfg.max_len, cfg.max_ratio)
    if texts.valid:
        logger.info("valid: %s", vstats.summary())
    if not train:
        raise DataError("no training pair survived filtering (see data.max_len / data.max_ratio)")
    return PreparedData(tokenizer, train, valid, texts, train_texts)
