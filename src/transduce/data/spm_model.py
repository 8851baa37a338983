"""SentencePiece models as bytes: training one in memory, loading one with the project's fixed
special ids, reading its type, and extending it with new pieces (what :class:`.Tokenizer` is
built from)."""

from __future__ import annotations

import io
import logging
import struct
from typing import Iterable, Sequence

import sentencepiece as spm

from transduce.errors import DataError, one_line

logger = logging.getLogger(__name__)

# The special ids are fixed for the whole project and baked into every model we train (see
# :mod:`.tokenizer`).
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
SPECIAL_PIECES = ("<pad>", "<s>", "</s>", "<unk>")
MODEL_TYPES = ("bpe", "unigram")
NORMALIZATION_RULE = "nmt_nfkc"
NUM_THREADS = 2  # small: BPE training is nearly serial and the machines we target are small


def train_proto(lines: list[str], vocab_size: int, model_type: str,
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
        max_sentence_length=1 << 16, num_threads=NUM_THREADS, minloglevel=2,
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


_USER_DEFINED = 4  # SentencePiece.Type: a piece segmentation always produces whole


def _piece_entry(piece: str, score: float, kind: int | None = None) -> bytes:
    """One serialized ``ModelProto.pieces`` entry: a NORMAL piece (protobuf's default type), or
    of type ``kind``."""
    text = piece.encode("utf-8")
    body = b"\x0a" + _varint(len(text)) + text + b"\x15" + struct.pack("<f", score)
    if kind is not None:
        body += b"\x18" + _varint(kind)
    return b"\x0a" + _varint(len(body)) + body


def sentinel_piece(n: int) -> str:
    """T5's n-th sentinel, the piece that stands for the n-th dropped span in span corruption."""
    return f"<extra_id_{n}>"


def add_sentinels(proto: bytes, count: int) -> bytes:
    """``proto`` with ``count`` sentinels ``<extra_id_N>`` appended as user-defined pieces, in
    T5's order: the last ids of the vocabulary counting down (``<extra_id_0>`` is the last id),
    as T5's tokenizer has them (and as :mod:`transduce.interop.t5` keeps them)."""
    return proto + b"".join(_piece_entry(sentinel_piece(n), 0.0, _USER_DEFINED) for n in range(count - 1, -1, -1))


def add_user_pieces(proto: bytes, pieces: Sequence[str]) -> bytes:
    """``proto`` with ``pieces`` appended as user-defined pieces (each always segmented whole), in
    order: a multilingual model's target-language tags ``<2de>``... (:mod:`transduce.data.multilingual`)."""
    return proto + b"".join(_piece_entry(piece, 0.0, _USER_DEFINED) for piece in pieces)


def _normal_pieces(sp: spm.SentencePieceProcessor) -> list[tuple[str, float]]:
    """(piece, score) of the ordinary pieces of a model, in id order (no control/unknown/unused)."""
    return [(sp.id_to_piece(i), sp.get_score(i)) for i in range(sp.get_piece_size())
            if not (sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i) or sp.is_byte(i))]


def extend_proto(proto: bytes, lines: list[str], max_new: int, seed: int) -> tuple[bytes, int]:
    """``proto`` with up to ``max_new`` pieces of a model trained on ``lines`` appended, and their
    count (see :meth:`Tokenizer.extended`)."""
    old = load_proto(proto, "extended tokenizer")
    kind = model_type(proto)
    if kind not in MODEL_TYPES:
        raise DataError(f"SentencePiece model: a {kind} model cannot be extended (bpe or unigram only)")
    new = load_proto(train_proto(lines, old.get_piece_size(), kind, 1.0, seed), "new text's tokenizer")
    have = {old.id_to_piece(i) for i in range(old.get_piece_size())}
    fresh = [(p, s) for p, s in _normal_pieces(new) if p not in have]
    fresh.sort(key=lambda ps: (len(ps[0]) > 1, -ps[1]))  # stable: characters, then by score
    fresh = fresh[:max_new]
    if kind == "bpe":  # merge priority: after every old merge, in the new model's order
        floor = min(s for _, s in _normal_pieces(old)) - 1.0
        fresh = [(p, floor - i) for i, (p, _) in enumerate(fresh)]
    return proto + b"".join(_piece_entry(p, s) for p, s in fresh), len(fresh)


def load_proto(proto: bytes, name: str) -> spm.SentencePieceProcessor:
    """A processor for ``proto``, checking the project's fixed special ids."""
    try:
        sp = spm.SentencePieceProcessor(model_proto=proto)
    except (RuntimeError, OSError, TypeError) as err:
        raise DataError(f"{name}: not a valid SentencePiece model ({one_line(err)})") from err
    found = (sp.pad_id(), sp.bos_id(), sp.eos_id(), sp.unk_id())
    if found != (PAD_ID, BOS_ID, EOS_ID, UNK_ID):
        raise DataError(f"{name}: special ids (pad, bos, eos, unk) are {found}, expected (0, 1, 2, 3)")
    return sp

