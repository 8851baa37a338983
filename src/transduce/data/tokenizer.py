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

import hashlib
import io
import logging
import os
import random
import struct
from itertools import chain
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import sentencepiece as spm
import yaml

from transduce.atomic import atomic_write_bytes
from transduce.checksums import record, verify
from transduce.data.wordcache import WordCache, word_separable
from transduce.errors import ConfigError, DataError, one_line

logger = logging.getLogger(__name__)

PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
SPECIAL_PIECES = ("<pad>", "<s>", "</s>", "<unk>")
SIDES = ("src", "tgt")
MODEL_TYPES = ("bpe", "unigram")
META_FILE = "tokenizer.yaml"
JOINT_MODEL = "spm.model"
SIDE_MODELS = {"src": "spm.src.model", "tgt": "spm.tgt.model"}
NORMALIZATION_RULE = "nmt_nfkc"
_NUM_THREADS = 2  # small: BPE training is nearly serial and the machines we target are small


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
        src_sp = _load_proto(src_proto, f"{name} (src)")
        tgt_sp = src_sp if self._joint else _load_proto(self._protos["tgt"], f"{name} (tgt)")
        self._sp = {"src": src_sp, "tgt": tgt_sp}
        self._word_caches: dict[int, WordCache | None] = {}  # per model (a joint one serves both sides)

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
        """
        if model_type not in MODEL_TYPES:
            raise ConfigError(f"model_type: expected one of {MODEL_TYPES}, got {model_type!r}")
        if vocab_size <= len(SPECIAL_PIECES):
            raise ConfigError(f"vocab_size: must be greater than 4, got {vocab_size}")
        src = _sample_lines(src_lines, max_sentences, seed)
        tgt = _sample_lines(tgt_lines, max_sentences, seed + 1)
        options = dict(vocab_size=vocab_size, model_type=model_type,
                       character_coverage=character_coverage, seed=seed)
        if joint:
            tok = cls(_train_spm(src + tgt, **options), name="joint")
        else:
            tok = cls(_train_spm(src, **options), _train_spm(tgt, **options), name="separate")
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
            proto, n = _extend_proto(self._protos["src"], src + tgt, max_new, seed)
            return Tokenizer(proto, name="extended joint"), (n, n)
        (s, n_src), (t, n_tgt) = (_extend_proto(self._protos[side], lines, max_new, seed)
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

    @property
    def protos(self) -> tuple[bytes, bytes | None]:
        """The serialized model(s): ``Tokenizer(*tok.protos)`` rebuilds it (e.g. in a worker process)."""
        return self._protos["src"], None if self._joint else self._protos["tgt"]

    # ---- encoding -------------------------------------------------------------------------

    @property
    def joint(self) -> bool:
        """True when source and target share one model (and one vocabulary)."""
        return self._joint

    @property
    def src_vocab_size(self) -> int:
        return self._sp["src"].get_piece_size()

    @property
    def tgt_vocab_size(self) -> int:
        return self._sp["tgt"].get_piece_size()

    def encode(self, text: str, side: str = "src") -> list[int]:
        """Token ids of ``text`` without BOS/EOS (those are added by ``corpus.collate``)."""
        return self._side(side).encode(text, out_type=int)

    def encode_batch(self, texts: Sequence[str], side: str = "src", num_threads: int = _NUM_THREADS
                     ) -> list[list[int]]:
        """:meth:`encode` for many texts at once (``num_threads`` inside SentencePiece)."""
        return self._side(side).encode(list(texts), out_type=int, num_threads=num_threads)

    def encode_flat(self, texts: Sequence[str], side: str = "src", num_threads: int = 1
                    ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`encode_batch`'s ids one text after another, and each text's length.

        Built a word at a time from a cache of word ids (:mod:`transduce.data.wordcache`): the same
        ids, a few times faster on a corpus. Returns (T,) int32 ids and (N,) int64 lengths.
        """
        sp = self._side(side)
        if id(sp) not in self._word_caches:
            self._word_caches[id(sp)] = WordCache(sp) if word_separable(sp) else None
        cache = self._word_caches[id(sp)]
        if cache is not None:
            return cache.encode(texts, num_threads)
        rows = sp.encode(list(texts), out_type=int, num_threads=num_threads)
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
        kept = []
        for i in ids:
            i = int(i)  # also accepts tensor elements
            if i == EOS_ID:
                break
            if i not in (PAD_ID, BOS_ID):
                kept.append(i)
        return self._side(side).decode(kept)

    def pieces(self, ids: Iterable[int], side: str = "tgt") -> list[str]:
        """Subword strings of ``ids`` (``▁`` marks a word start), e.g. for attention plots."""
        sp = self._side(side)
        return [sp.id_to_piece(int(i)) for i in ids]

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


def _sample_lines(lines: Iterable[str], max_sentences: int | None, seed: int) -> list[str]:
    """Non-empty lines, or a seeded sample of ``max_sentences`` of them kept in corpus order."""
    kept = [line for line in lines if line.strip()]
    if max_sentences is not None and len(kept) > max_sentences:
        picked = sorted(random.Random(seed).sample(range(len(kept)), max_sentences))
        kept = [kept[i] for i in picked]
    return kept


def _train_spm(lines: list[str], vocab_size: int, model_type: str,
               character_coverage: float, seed: int) -> bytes:
    """Train one SentencePiece model on ``lines``; returns the serialized model."""
    if not lines:
        raise DataError("tokenizer training: no non-empty lines to train on")
    try:
        return _run_trainer(lines, vocab_size, model_type, character_coverage, seed, True)
    except RuntimeError as err:
        if "Vocabulary size too high" not in str(err):
            raise DataError(f"tokenizer training failed: {one_line(err)}") from err
    logger.warning("vocab_size %d is too large for %d lines; using a smaller vocabulary",
                   vocab_size, len(lines))
    try:
        return _run_trainer(lines, vocab_size, model_type, character_coverage, seed, False)
    except RuntimeError as err:
        raise DataError(f"tokenizer training failed: {one_line(err)}") from err


def _run_trainer(lines: list[str], vocab_size: int, model_type: str,
                 character_coverage: float, seed: int, hard_vocab_limit: bool) -> bytes:
    spm.set_random_generator_seed(seed)
    buffer = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=buffer,
        vocab_size=vocab_size, model_type=model_type, character_coverage=character_coverage,
        hard_vocab_limit=hard_vocab_limit,
        pad_id=PAD_ID, bos_id=BOS_ID, eos_id=EOS_ID, unk_id=UNK_ID,
        pad_piece="<pad>", bos_piece="<s>", eos_piece="</s>", unk_piece="<unk>",
        byte_fallback=False, normalization_rule_name=NORMALIZATION_RULE,
        input_sentence_size=0, shuffle_input_sentence=False,  # we sample ourselves, seeded
        max_sentence_length=1 << 16, num_threads=_NUM_THREADS, minloglevel=2,
    )
    return buffer.getvalue()


# ---- extending a model: its serialized ModelProto, edited as protobuf wire data ----------------
# SentencePiece's maintainers suggest editing the model's ``pieces`` (field 1 of ModelProto, a
# repeated SentencePiece message: piece = 1, score = 2, type = 3) to add to a trained model
# (google/sentencepiece#121, #791). A repeated field's entries may come anywhere in the message
# and are read in order, so appending encoded entries to the bytes appends pieces, with no
# protobuf dependency. The model type is TrainerSpec (field 2) field 3 (1 unigram, 2 bpe, 3 word,
# 4 char).

_SPM_TYPES = {1: "unigram", 2: "bpe", 3: "word", 4: "char"}


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _read_varint(data: bytes, i: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        b = data[i]
        n |= (b & 0x7F) << shift
        i, shift = i + 1, shift + 7
        if not b & 0x80:
            return n, i


def _fields(data: bytes) -> Iterable[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of each field of a serialized message, in order: an int
    for varints, bytes for length-delimited and fixed-width fields."""
    i = 0
    while i < len(data):
        key, i = _read_varint(data, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _read_varint(data, i)
        elif wire == 2:
            size, i = _read_varint(data, i)
            value, i = data[i:i + size], i + size
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            value, i = data[i:i + width], i + width
        else:
            raise DataError(f"SentencePiece model: unexpected protobuf wire type {wire}")
        yield number, wire, value


def model_type(proto: bytes) -> str:
    """A serialized SentencePiece model's type: "unigram", "bpe", "word" or "char", read from its
    TrainerSpec (unigram is protobuf's default), so without the protobuf package."""
    spec = next((v for n, w, v in _fields(proto) if n == 2 and w == 2), b"")
    code = next((v for n, w, v in _fields(spec) if n == 3 and w == 0), 1)
    if code not in _SPM_TYPES:
        raise DataError(f"SentencePiece model: unknown model type {code}")
    return _SPM_TYPES[code]


def _piece_entry(piece: str, score: float) -> bytes:
    """One serialized ``ModelProto.pieces`` entry: a NORMAL piece (protobuf's default type)."""
    text = piece.encode("utf-8")
    body = b"\x0a" + _varint(len(text)) + text + b"\x15" + struct.pack("<f", score)
    return b"\x0a" + _varint(len(body)) + body


def _normal_pieces(sp: spm.SentencePieceProcessor) -> list[tuple[str, float]]:
    """(piece, score) of the ordinary pieces of a model, in id order (no control/unknown/unused)."""
    return [(sp.id_to_piece(i), sp.get_score(i)) for i in range(sp.get_piece_size())
            if not (sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i) or sp.is_byte(i))]


def _extend_proto(proto: bytes, lines: list[str], max_new: int, seed: int) -> tuple[bytes, int]:
    """``proto`` with up to ``max_new`` pieces of a model trained on ``lines`` appended, and their
    count (see :meth:`Tokenizer.extended`)."""
    old = _load_proto(proto, "extended tokenizer")
    kind = model_type(proto)
    if kind not in MODEL_TYPES:
        raise DataError(f"SentencePiece model: a {kind} model cannot be extended (bpe or unigram only)")
    new = _load_proto(_train_spm(lines, old.get_piece_size(), kind, 1.0, seed), "new text's tokenizer")
    have = {old.id_to_piece(i) for i in range(old.get_piece_size())}
    fresh = [(p, s) for p, s in _normal_pieces(new) if p not in have]
    fresh.sort(key=lambda ps: (len(ps[0]) > 1, -ps[1]))  # stable: characters, then by score
    fresh = fresh[:max_new]
    if kind == "bpe":  # merge priority: after every old merge, in the new model's order
        floor = min(s for _, s in _normal_pieces(old)) - 1.0
        fresh = [(p, floor - i) for i, (p, _) in enumerate(fresh)]
    return proto + b"".join(_piece_entry(p, s) for p, s in fresh), len(fresh)


def _load_proto(proto: bytes, name: str) -> spm.SentencePieceProcessor:
    """A processor for ``proto``, checking the project's fixed special ids."""
    try:
        sp = spm.SentencePieceProcessor(model_proto=proto)
    except (RuntimeError, OSError, TypeError) as err:
        raise DataError(f"{name}: not a valid SentencePiece model ({one_line(err)})") from err
    found = (sp.pad_id(), sp.bos_id(), sp.eos_id(), sp.unk_id())
    if found != (PAD_ID, BOS_ID, EOS_ID, UNK_ID):
        raise DataError(f"{name}: special ids (pad, bos, eos, unk) are {found}, expected (0, 1, 2, 3)")
    return sp


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
