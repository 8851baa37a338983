"""Subword tokenization with SentencePiece (Kudo & Richardson, 2018).

The paper (Section 5.1) uses byte-pair encoding with a shared source-target vocabulary of about
37,000 tokens for English-German; :meth:`Tokenizer.train` builds such a joint model, or two
separate ones (one per side), with either BPE or the unigram language model.

Special ids are fixed for the whole project and baked into every model we train::

    PAD_ID = 0  <pad>   padding; never predicted, ignored by the loss
    BOS_ID = 1  <s>     first decoder input
    EOS_ID = 2  </s>    end of source and of target labels
    UNK_ID = 3  <unk>   characters not covered by the model

Text is normalised with SentencePiece's ``nmt_nfkc`` rule (NFKC plus the NMT clean-ups:
control characters removed, all whitespace variants mapped to a space) and runs of spaces are
collapsed, so ``decode(encode(s)) == s`` holds for text that is already normalised;
:meth:`Tokenizer.normalize` gives that form. ``byte_fallback`` is off: a character never seen in
training becomes ``<unk>`` rather than UTF-8 byte pieces.

On disk a tokenizer is a directory holding ``spm.model`` (joint) or ``spm.src.model`` and
``spm.tgt.model`` (separate), plus ``tokenizer.yaml`` recording which.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import random
import re
from itertools import chain
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import sentencepiece as spm
import yaml

from transduce.atomic import atomic_write_bytes
from transduce.checksums import record, verify
from transduce.data.hf_tokenizer import HF_FILE, HFTokenizer
from transduce.data.spm_model import (BOS_ID, EOS_ID, MODEL_TYPES, NORMALIZATION_RULE, NUM_THREADS, PAD_ID,
                                      SPECIAL_PIECES, UNK_ID as UNK_ID, add_sentinels, extend_proto, load_proto,
                                      train_proto, add_user_pieces)
from transduce.data.wordcache import WordCache, word_separable
from transduce.errors import ConfigError, DataError, one_line

logger = logging.getLogger(__name__)
_TAG = re.compile(r"<2([a-z]{2,3})>")  # a target-language tag (transduce.data.multilingual)
# a language code: M2M-100's (__fr__ for fr), NLLB's (fra_Latn) or mBART-50's (fr_XX)
LANG_CODE = re.compile(r"__([a-z]{2,3})__|([a-z]{3}_[A-Z][a-z]{3})|([a-z]{2}_[A-Z]{2})")

SIDES = ("src", "tgt")
META_FILE = "tokenizer.yaml"
JOINT_MODEL = "spm.model"
SIDE_MODELS = {"src": "spm.src.model", "tgt": "spm.tgt.model"}


class Tokenizer:
    """One joint or two separate (source, target) SentencePiece models.

    Args:
        src_proto: serialized SentencePiece model for the source side (or both, if joint).
        tgt_proto: serialized model for the target side; ``None`` means joint.
        name: where the models came from, used in error messages.

    Examples:
        >>> tok = Tokenizer.train(src, tgt, "run/tokenizer", vocab_size=8000)  # doctest: +SKIP
        >>> ids = tok.encode("A dog runs.", side="src")                       # doctest: +SKIP
        >>> tok.decode(ids, side="src")                                        # doctest: +SKIP
        'A dog runs.'
    """

    def __init__(self, src_proto: bytes, tgt_proto: bytes | None = None, name: str = "<memory>"):
        self._joint = tgt_proto is None
        self._protos = {"src": src_proto, "tgt": src_proto if tgt_proto is None else tgt_proto}
        src_sp = load_proto(src_proto, f"{name} (src)")
        tgt_sp = src_sp if self._joint else load_proto(self._protos["tgt"], f"{name} (tgt)")
        self._sp = {"src": src_sp, "tgt": tgt_sp}
        self._word_caches: dict[int, WordCache | None] = {}  # per model (a joint one serves both sides)
        self._unused_pieces: dict[int, dict[str, int]] = {}  # likewise
        self._piece_tables: dict[int, list[str]] = {}  # likewise

    # ---- training -------------------------------------------------------------------------

    @classmethod
    def train(
        cls,
        src_lines: Iterable[str],
        tgt_lines: Iterable[str],
        out_dir: str | os.PathLike,
        vocab_size: int,
        model_type: str = "bpe",
        joint: bool = True,
        character_coverage: float = 1.0,
        max_sentences: int | None = None,
        seed: int = 0,
        sentinels: int = 0,
        tags: Sequence[str] = (),
    ) -> "Tokenizer":
        """Train SentencePiece model(s) in memory, save them into ``out_dir`` and return them.

        Deterministic: the same lines and arguments give byte-identical models.

        Args:
            src_lines: source training text, one sentence per item (empty lines skipped).
            tgt_lines: target training text, likewise.
            out_dir: directory to save into (created if needed).
            vocab_size: pieces per model, special pieces included. If the text cannot fill it,
                training is retried with ``hard_vocab_limit=False`` (a smaller vocabulary).
            model_type: ``"bpe"`` or ``"unigram"``.
            joint: one model for both sides (paper, Section 5.1) or one per side.
            character_coverage: fraction of characters covered; 1.0 for small alphabets.
            max_sentences: if set, train on at most this many lines *per side*, sampled with
                ``seed``.
            seed: seeds the sentence sample and SentencePiece's own generator.
            sentinels: T5's ``<extra_id_N>`` pieces reserved at the end of each model (within
                ``vocab_size``; :func:`~transduce.data.spm_model.add_sentinels`).
            tags: user-defined pieces reserved before the sentinels (within ``vocab_size``): a
                multilingual model's target-language tags ``<2de>``... (each always one piece).
        """
        if model_type not in MODEL_TYPES:
            raise ConfigError(f"model_type: expected one of {MODEL_TYPES}, got {model_type!r}")
        reserved = sentinels + len(tags)
        if vocab_size - reserved <= len(SPECIAL_PIECES):
            raise ConfigError(f"vocab_size: must be greater than 4 + {reserved} reserved pieces, got {vocab_size}")
        src = _sample_lines(src_lines, max_sentences, seed)
        tgt = _sample_lines(tgt_lines, max_sentences, seed + 1)
        options = dict(vocab_size=vocab_size - reserved, model_type=model_type,
                       character_coverage=character_coverage, seed=seed)

        def trained(lines: list[str]) -> bytes:
            return add_sentinels(add_user_pieces(train_proto(lines, **options), tags), sentinels)
        tok = cls(trained(src + tgt), name="joint") if joint else cls(trained(src), trained(tgt), name="separate")
        tok.save(out_dir)
        logger.info("trained %s %s tokenizer (vocab src %d, tgt %d) into %s",
                    "joint" if joint else "separate", model_type,
                    tok.src_vocab_size, tok.tgt_vocab_size, out_dir)
        return cls.load(out_dir)  # what later runs will see

    def extended(self, src_lines: Iterable[str], tgt_lines: Iterable[str], max_new: int,
                 seed: int = 0) -> tuple["Tokenizer", tuple[int, int]]:
        """This tokenizer with pieces of new text appended: every old piece keeps its id.

        A SentencePiece model of the same type and size is trained on the new text (as
        :meth:`train` does: joint on both sides, or one per side); its pieces the old model lacks
        are appended, at most ``max_new`` per model, single characters first (every longer piece
        is built from them) then the rest best-scored first. A BPE piece's score is its merge
        priority: the new merges rank below every old one, in the new model's order, so old
        merges apply first; a unigram piece keeps the new model's log-probability. Text with none
        of the new pieces in it encodes to the same ids as before.

        Returns the extended tokenizer (not saved) and how many pieces each side gained.
        """
        if max_new < 1:
            raise ConfigError(f"train.extend_vocab: must be at least 1 new piece; got {max_new}")
        src, tgt = _sample_lines(src_lines, None, seed), _sample_lines(tgt_lines, None, seed)
        if self._joint:
            proto, n = extend_proto(self._protos["src"], src + tgt, max_new, seed)
            return Tokenizer(proto, name="extended joint"), (n, n)
        (s, n_src), (t, n_tgt) = (extend_proto(self._protos[side], lines, max_new, seed)
                                  for side, lines in (("src", src), ("tgt", tgt)))
        return Tokenizer(s, t, name="extended separate"), (n_src, n_tgt)

    def extends(self, other: "Tokenizer") -> bool:
        """Whether this tokenizer is ``other`` or ``other`` with pieces appended (:meth:`extended`):
        joint alike, and every piece of ``other`` at the same id on each side."""
        if self._joint != other._joint:
            return False
        for side in SIDES:
            mine, theirs = self._sp[side], other._sp[side]
            n = theirs.get_piece_size()
            if mine.get_piece_size() < n or any(mine.id_to_piece(i) != theirs.id_to_piece(i) for i in range(n)):
                return False
        return True

    # ---- persistence ----------------------------------------------------------------------

    def save(self, out_dir: str | os.PathLike) -> None:
        """Write the model file(s) and ``tokenizer.yaml`` into ``out_dir`` (atomically per file)."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        models = [JOINT_MODEL] if self._joint else [SIDE_MODELS[side] for side in SIDES]
        for name, proto in zip(models, (self._protos["src"], self._protos["tgt"])):
            atomic_write_bytes(out / name, proto)
        meta = {"joint": self._joint, "src_vocab_size": self.src_vocab_size,
                "tgt_vocab_size": self.tgt_vocab_size, "normalization": NORMALIZATION_RULE}
        atomic_write_bytes(out / META_FILE, yaml.safe_dump(meta, sort_keys=False).encode("utf-8"))
        record(out, [*models, META_FILE])  # checksums.sha256: loading checks them

    @classmethod
    def load(cls, directory: str | os.PathLike) -> "Tokenizer":
        """Load a tokenizer saved by :meth:`save`; a missing or unreadable one raises DataError, a
        file that does not match its recorded checksum CheckpointError (see transduce.checksums)."""
        root = Path(directory)
        for name in (META_FILE, JOINT_MODEL, *SIDE_MODELS.values()):
            verify(root, name)  # a flipped byte: CheckpointError naming the file (see transduce.checksums)
        joint = _read_meta(root / META_FILE)
        if joint:
            return cls(_read_model(root / JOINT_MODEL), name=str(root / JOINT_MODEL))
        src = _read_model(root / SIDE_MODELS["src"])
        tgt = _read_model(root / SIDE_MODELS["tgt"])
        return cls(src, tgt, name=str(root))

    @staticmethod
    def exists(directory: str | os.PathLike) -> bool:
        """Whether ``directory`` holds a saved tokenizer (metadata and model files present)."""
        root = Path(directory)
        if not (root / META_FILE).is_file():
            return False
        if (root / JOINT_MODEL).is_file():
            return True
        return all((root / name).is_file() for name in SIDE_MODELS.values())

    def digest(self) -> str:
        """sha256 of the model(s): equal digests, equal segmentation (prepared data records it)."""
        h = hashlib.sha256(b"joint" if self._joint else b"separate")
        for side in SIDES:
            h.update(self._protos[side])
        return h.hexdigest()

    def __reduce__(self):  # pickled as its model bytes (a worker process rebuilds it)
        return Tokenizer, self.protos

    @property
    def protos(self) -> tuple[bytes, bytes | None]:
        """The serialized model(s): ``Tokenizer(*tok.protos)`` rebuilds it (e.g. in a worker process)."""
        return self._protos["src"], None if self._joint else self._protos["tgt"]

    # ---- encoding -------------------------------------------------------------------------

    @property
    def joint(self) -> bool:
        """True when source and target share one model (and one vocabulary)."""
        return self._joint

    # the special ids, as :class:`~transduce.data.hf_tokenizer.HFTokenizer` names its own
    pad_id, bos_id, eos_id, unk_id = PAD_ID, BOS_ID, EOS_ID, UNK_ID
    mask_id = None  # no [MASK] piece: an encoder-only model's is one id past the vocabulary
    add_bos_token = True  # our models read BOS first (batch.pad), language models' prompts included

    @functools.cached_property
    def lang_tags(self) -> dict[str, int]:
        """A multilingual model's target languages and their tags' ids (``{"de": id of <2de>}``):
        the source side's user-defined pieces spelled ``<2xx>``; empty for any other model."""
        sp = self._sp["src"]
        return {m.group(1): i for i in range(sp.get_piece_size())
                if (m := _TAG.fullmatch(sp.id_to_piece(i))) and _whole(sp, m.group(0))}

    @functools.cached_property
    def lang_codes(self) -> dict[str, int]:
        """An imported NLLB, M2M-100 or mBART-50 model's languages and their codes' ids
        (``{"fra_Latn": id}``, ``{"fr": id of __fr__}``, ``{"fr_XX": id}``): the target side's control
        pieces spelled so (:data:`LANG_CODE`), which text never segments to and decoding writes as
        nothing; empty for any other model (:func:`transduce.data.multilingual.code_ids`)."""
        sp = self._sp["tgt"]
        return {next(g for g in m.groups() if g): i for i in range(sp.get_piece_size())
                if sp.is_control(i) and (m := LANG_CODE.fullmatch(sp.id_to_piece(i)))}

    @property
    def src_vocab_size(self) -> int:
        return self._sp["src"].get_piece_size()

    @property
    def tgt_vocab_size(self) -> int:
        return self._sp["tgt"].get_piece_size()

    def encode(self, text: str, side: str = "src") -> list[int]:
        """Token ids of ``text`` without BOS/EOS (those are added by ``corpus.collate``).

        A span of characters the model does not know is ``<unk>``, unless the span is spelled as
        one of the model's UNUSED pieces: then it gets that piece's id. An imported Marian model's
        UNUSED pieces are the shared vocabulary's entries this side's model lacks, so this is
        MarianTokenizer's lookup of each piece *string* in vocab.json (:mod:`transduce.interop.marian`)."""
        return self._respelled(self._side(side).encode(text, out_type=int), text, side)

    def encode_batch(self, texts: Sequence[str], side: str = "src", num_threads: int = NUM_THREADS
                     ) -> list[list[int]]:
        """:meth:`encode` for many texts at once (``num_threads`` inside SentencePiece)."""
        texts = list(texts)
        rows = self._side(side).encode(texts, out_type=int, num_threads=num_threads)
        return [self._respelled(row, text, side) for row, text in zip(rows, texts)]

    def _respelled(self, ids: list[int], text: str, side: str) -> list[int]:
        """``ids`` with each unknown span spelled as an UNUSED piece given that piece's id."""
        if UNK_ID not in ids or not self._unused(side):
            return ids
        spans = self._sp[side].encode(text, out_type=str)  # the same segmentation, as strings
        return [self._unused(side).get(piece, UNK_ID) if i == UNK_ID else i for i, piece in zip(ids, spans)]

    def _unused(self, side: str) -> dict[str, int]:
        """UNUSED piece -> id for ``side``'s model (computed once)."""
        sp = self._sp[side]
        if id(sp) not in self._unused_pieces:
            table = self._piece_table(side)
            self._unused_pieces[id(sp)] = {table[i]: i for i in range(len(table)) if sp.is_unused(i)}
        return self._unused_pieces[id(sp)]

    def encode_flat(self, texts: Sequence[str], side: str = "src", num_threads: int = 1
                    ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`encode_batch`'s ids one text after another, and each text's length.

        Built a word at a time from a cache of word ids (:mod:`transduce.data.wordcache`): the same
        ids, a few times faster on a corpus. Returns (T,) int32 ids and (N,) int64 lengths.
        """
        sp = self._side(side)
        if id(sp) not in self._word_caches:  # (the cache knows nothing of UNUSED pieces)
            self._word_caches[id(sp)] = WordCache(sp) if word_separable(sp) and not self._unused(side) else None
        cache = self._word_caches[id(sp)]
        if cache is not None:
            return cache.encode(texts, num_threads)
        rows = self.encode_batch(texts, side, num_threads)
        lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
        return np.fromiter(chain.from_iterable(rows), dtype=np.int32, count=int(lengths.sum())), lengths

    def sample_batch(self, texts: Sequence[str], side: str, dropout: float, seed: int) -> list[list[int]]:
        """Randomly segmented ids of ``texts``: BPE-dropout (Provilkov et al., 2020).

        Each merge is skipped with probability ``dropout``, so a word may come out in smaller
        pieces than :meth:`encode` gives (``dropout=0`` is :meth:`encode`). The same
        ``(texts, dropout, seed)`` always gives the same ids: SentencePiece seeds its sampler
        from a process-wide seed at each call, which is set here, and one thread is used so
        that no split of the work between threads can change which sentence draws which
        numbers. Only for BPE models (for unigram ones SentencePiece's ``alpha`` means
        something else).
        """
        sp = self._side(side)
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        spm.set_random_generator_seed(seed % 2**32)
        return sp.encode(list(texts), out_type=int, enable_sampling=True, alpha=dropout, nbest_size=-1,
                         num_threads=1)

    def decode(self, ids: Iterable[int], side: str = "tgt") -> str:
        """Text of ``ids``: stops at the first EOS and skips PAD and BOS."""
        ids = list(map(int, ids))  # (also accepts tensor elements)
        if EOS_ID in ids:
            ids = ids[:ids.index(EOS_ID)]
        return self._side(side).decode([i for i in ids if i != PAD_ID and i != BOS_ID])

    def pieces(self, ids: Iterable[int], side: str = "tgt") -> list[str]:
        """Subword strings of ``ids`` (``▁`` marks a word start), e.g. for attention plots."""
        table = self._piece_table(side)
        ids = list(map(int, ids))  # (also accepts tensor elements)
        if not ids or (min(ids) >= 0 and max(ids) < len(table)):
            return [table[i] for i in ids]
        sp = self._side(side)
        return [sp.id_to_piece(i) for i in ids]  # (its error for an id out of range)

    def _piece_table(self, side: str) -> list[str]:
        """Every piece of ``side``'s model by id (made once: a list lookup is much cheaper than
        SentencePiece's per-id call, and output pieces are read for every hypothesis)."""
        sp = self._side(side)
        if id(sp) not in self._piece_tables:
            self._piece_tables[id(sp)] = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
        return self._piece_tables[id(sp)]

    def normalize(self, text: str, side: str = "src") -> str:
        """``text`` as :meth:`decode` gives it back (nmt_nfkc, whitespace collapsed)."""
        # SentencePiece marks spaces with U+2581 and adds one as a dummy word prefix
        return self._side(side).normalize(text).replace("\u2581", " ").strip(" ")

    def _side(self, side: str) -> spm.SentencePieceProcessor:
        if side not in SIDES:
            raise ValueError(f"side must be 'src' or 'tgt', got {side!r}")
        return self._sp[side]

    def __repr__(self) -> str:
        return (f"Tokenizer(joint={self._joint}, src_vocab_size={self.src_vocab_size}, "
                f"tgt_vocab_size={self.tgt_vocab_size})")


def _whole(sp: spm.SentencePieceProcessor, piece: str) -> bool:
    """Whether ``piece`` always segments whole (a user-defined piece: perhaps after a lone ``▁``)."""
    pieces = sp.encode(piece, out_type=str)
    return pieces[-1:] == [piece] and len(pieces) <= 2


def load_tokenizer(directory: str | os.PathLike) -> "Tokenizer | HFTokenizer":
    """The tokenizer a model directory holds, whichever kind: a Hugging Face ``tokenizer.json``
    (byte-level BPE or WordPiece, :class:`~transduce.data.hf_tokenizer.HFTokenizer`) or
    SentencePiece model(s) (:class:`Tokenizer`). Every command opens tokenizers through here."""
    if (Path(directory) / HF_FILE).is_file():
        return HFTokenizer.load(directory)
    return Tokenizer.load(directory)


def tokenizer_exists(directory: str | os.PathLike) -> bool:
    """Whether ``directory`` holds a saved tokenizer of either kind."""
    root = Path(directory)
    return Tokenizer.exists(root) or ((root / HF_FILE).is_file() and (root / META_FILE).is_file())


def _sample_lines(lines: Iterable[str], max_sentences: int | None, seed: int) -> list[str]:
    """Non-empty lines, or a seeded sample of ``max_sentences`` of them kept in corpus order."""
    kept = [line for line in lines if line.strip()]
    if max_sentences is not None and len(kept) > max_sentences:
        picked = sorted(random.Random(seed).sample(range(len(kept)), max_sentences))
        kept = [kept[i] for i in picked]
    return kept


def _read_meta(path: Path) -> bool:
    """The ``joint`` flag from ``tokenizer.yaml``."""
    if not path.is_file():
        raise DataError(f"{path}: no saved tokenizer here (missing {META_FILE})")
    try:
        meta = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise DataError(f"{path}: unreadable tokenizer metadata ({one_line(err)})") from err
    if not isinstance(meta, dict) or not isinstance(meta.get("joint"), bool):
        raise DataError(f"{path}: expected a mapping with a boolean 'joint' key")
    return meta["joint"]


def _read_model(path: Path) -> bytes:
    if not path.is_file():
        raise DataError(f"{path}: tokenizer model file is missing")
    return path.read_bytes()
