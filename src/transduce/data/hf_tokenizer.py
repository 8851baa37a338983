"""Byte-level BPE (GPT-2, RoBERTa) and WordPiece (BERT) tokenizers, through Hugging Face's
``tokenizers`` library (the ``pretrained`` extra, imported lazily).

A pretrained model keeps its own tokenizer exactly: the Hugging Face ``tokenizer.json`` is carried
verbatim inside the model directory, so its ids are those of ``AutoTokenizer`` on any text (accents,
emoji, CJK, control characters, runs of spaces, empty lines). Its special tokens are not ours
(pad 0, bos 1, eos 2, unk 3 of :mod:`transduce.data.tokenizer`): ``tokenizer.yaml`` records each
role's token and id, e.g. GPT-2's ``<|endoftext|>`` 50256 as bos, eos and pad. One vocabulary serves
both sides (``side`` is accepted and ignored), as a decoder-only or encoder-only model has one.

Whether the model reads BOS before a text is the tokenizer's too (Hugging Face's ``add_bos_token``):
BERT's [CLS] and RoBERTa's ``<s>`` come first, GPT-2's ``<|endoftext|>`` does not, so
:class:`~transduce.inference.Generator` prompts an imported GPT-2 as ``AutoTokenizer`` does.

An imported BERT's or RoBERTa's ids are the original checkpoint's renumbered (its special tokens
moved to ours, :mod:`transduce.interop.bert_vocab`): its tokenizer keeps an :class:`HFOrigin`,
the specials' ids in the original and the files ``AutoTokenizer`` read there beside
``tokenizer.json``, so that an export, of the import or of a model fine-tuned from it, gives the
original's ids and files back.

On disk: ``tokenizer.json`` (Hugging Face's file) and ``tokenizer.yaml`` (``kind``, ``vocab_size``,
``specials``, ``add_bos_token``, and ``origin`` where there is one);
:func:`transduce.data.tokenizer.load_tokenizer` opens whichever kind a directory holds.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import yaml

from transduce.atomic import atomic_write_bytes
from transduce.checksums import record, verify
from transduce.errors import DataError, one_line, require

HF_FILE = "tokenizer.json"
META_FILE = "tokenizer.yaml"
KINDS = ("byte_level_bpe", "wordpiece")
ROLES = ("pad", "bos", "eos", "unk", "cls", "sep", "mask")
# Which roles stand in for ours where a model has no token of that role: GPT-2 has only
# <|endoftext|>, which begins, ends and pads; BERT begins with [CLS] and ends with [SEP].
FALLBACKS = {"bos": ("cls", "eos"), "eos": ("sep", "bos"), "pad": ("eos", "unk")}
# What AutoTokenizer reads beside tokenizer.json: the class and its options (``do_lower_case``,
# ``add_prefix_space``...) and the special tokens' names.
SIDE_FILES = ("tokenizer_config.json", "special_tokens_map.json")


def _library():
    return require("tokenizers", "pretrained", "a byte-level BPE or WordPiece tokenizer")


def kind_of(raw: dict, name: str) -> str:
    """``byte_level_bpe`` or ``wordpiece`` for a parsed tokenizer.json; a DataError for another kind."""
    model = (raw.get("model") or {}).get("type")
    pre = json.dumps(raw.get("pre_tokenizer"))
    if model == "BPE" and "ByteLevel" in pre:
        return "byte_level_bpe"
    if model == "WordPiece":
        return "wordpiece"
    raise DataError(f"{name}: unsupported tokenizer (model {model!r}); transduce reads byte-level BPE "
                    "(GPT-2, RoBERTa) and WordPiece (BERT)")


@dataclass(frozen=True)
class HFOrigin:
    """The Hugging Face checkpoint a tokenizer was imported from with its ids renumbered.

    Attributes:
        ids: role (``pad``, ``cls``...) -> that special token's id in the original.
        files: :data:`SIDE_FILES` name -> the original's text of that file, verbatim.
    """

    ids: dict[str, int]
    files: dict[str, str]

    @classmethod
    def read(cls, where: str | os.PathLike, ids: dict[str, int]) -> "HFOrigin":
        """The origin of a tokenizer imported from the directory ``where``, whose specials had ``ids``."""
        root = Path(where)
        return cls(dict(ids), {name: (root / name).read_text(encoding="utf-8") for name in SIDE_FILES
                               if (root / name).is_file()})

    def as_dict(self) -> dict:
        """What ``tokenizer.yaml`` holds under ``origin``."""
        return {"ids": dict(self.ids), "files": dict(self.files)}

    @classmethod
    def from_dict(cls, raw, path: Path) -> "HFOrigin":
        """What :meth:`as_dict` gave, read back from ``path``; a one-line DataError if it is not that."""
        ids, files = (raw.get("ids"), raw.get("files")) if isinstance(raw, dict) else (None, None)
        if not (isinstance(ids, dict) and all(r in ROLES and type(i) is int for r, i in ids.items())
                and isinstance(files, dict) and all(n in SIDE_FILES and isinstance(t, str) for n, t in files.items())):
            raise DataError(f"{path}: 'origin' must hold 'ids' (role -> id) and 'files' (one of {SIDE_FILES} -> text)")
        return cls(ids, files)


class HFTokenizer:
    """A Hugging Face ``tokenizers`` tokenizer with its special tokens, behind the same calls as
    :class:`~transduce.data.tokenizer.Tokenizer` (encode, decode, pieces, vocab sizes, special ids).

    Args:
        data: the ``tokenizer.json`` text (bytes).
        specials: role (``pad``, ``bos``, ``eos``, ``unk``, ``cls``, ``sep``, ``mask``) -> token string.
        name: where it came from, for error messages.
        add_bos_token: whether the model reads BOS before a text (:meth:`encode` never adds it; the
            caller does): None takes what ``tokenizer.json``'s post-processor does.
        origin: the checkpoint whose ids ``data``'s are renumbered from, or None (they are its own).
    """

    def __init__(self, data: bytes, specials: dict[str, str], name: str = "<memory>",
                 add_bos_token: bool | None = None, origin: HFOrigin | None = None):
        lib = _library()
        try:
            raw = json.loads(data.decode("utf-8"))
            self._tok = lib.Tokenizer.from_str(data.decode("utf-8"))
        except Exception as err:  # bad UTF-8 or JSON; the library raises a bare Exception
            raise DataError(f"{name}: corrupt tokenizer file ({one_line(err)})") from None
        self.kind = kind_of(raw, name)
        self._data = data
        self.name = name
        self.tokens: dict[str, str] = {}
        for role, token in specials.items():
            if role not in ROLES:
                raise DataError(f"{name}: unknown special-token role {role!r}; expected one of {ROLES}")
            if self._tok.token_to_id(token) is None:
                raise DataError(f"{name}: special token {token!r} ({role}) is not in the vocabulary")
            self.tokens[role] = token
        self.ids = {role: self._tok.token_to_id(tok) for role, tok in self.tokens.items()}
        for role, alternatives in FALLBACKS.items():
            if role not in self.ids:
                found = [self.ids[a] for a in alternatives if a in self.ids]
                if not found:
                    raise DataError(f"{name}: no {role} token (nor {' or '.join(alternatives)}) among the specials")
                self.ids[role] = found[0]
        self.add_bos_token = self._template_adds_bos() if add_bos_token is None else add_bos_token
        self.origin = origin

    def _template_adds_bos(self) -> bool:
        """Whether ``tokenizer.json``'s post-processor puts BOS before a text (BERT's, RoBERTa's)."""
        plain = self._tok.encode("a", add_special_tokens=False).ids
        full = self._tok.encode("a", add_special_tokens=True).ids
        return full[:1] == [self.bos_id] and full[1:1 + len(plain)] == plain

    # ---- the interface every command uses ----------------------------------------------------

    joint = True  # one vocabulary for both sides

    @property
    def pad_id(self) -> int:
        return self.ids["pad"]

    @property
    def bos_id(self) -> int:
        return self.ids["bos"]

    @property
    def eos_id(self) -> int:
        return self.ids["eos"]

    @property
    def unk_id(self) -> int | None:
        return self.ids.get("unk")

    @property
    def mask_id(self) -> int | None:
        """[MASK] / ``<mask>`` (an imported BERT's or RoBERTa's, renumbered to the last id), or None."""
        return self.ids.get("mask")

    @property
    def data(self) -> bytes:
        """The ``tokenizer.json`` text (bytes)."""
        return self._data

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    src_vocab_size = tgt_vocab_size = vocab_size

    def encode(self, text: str, side: str = "src") -> list[int]:
        """Token ids of ``text`` without the model's added specials (``add_special_tokens=False``)."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str], side: str = "src", num_threads: int = 1) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def encode_flat(self, texts: Sequence[str], side: str = "src", num_threads: int = 1
                    ) -> tuple[np.ndarray, np.ndarray]:
        """The ids of ``texts`` one after another (T,) int32, and each text's length (N,) int64."""
        rows = self.encode_batch(texts, side)
        lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
        return np.fromiter((i for r in rows for i in r), dtype=np.int32, count=int(lengths.sum())), lengths

    def decode(self, ids: Iterable[int], side: str = "tgt") -> str:
        """Text of ``ids``: stops at the first EOS, skips PAD, BOS and every other special token.
        A first id equal to BOS is skipped, not taken for EOS (GPT-2's one token is both)."""
        kept = []
        for n, i in enumerate(ids):
            i = int(i)
            if i == self.eos_id and not (n == 0 and i == self.bos_id):
                break
            kept.append(i)
        return self._tok.decode(kept, skip_special_tokens=True)

    def pieces(self, ids: Iterable[int], side: str = "tgt") -> list[str]:
        return [self._tok.id_to_token(int(i)) for i in ids]

    def normalize(self, text: str, side: str = "src") -> str:
        """``text`` as :meth:`decode` gives it back."""
        return self.decode(self.encode(text))

    def digest(self) -> str:
        """sha256 of the tokenizer file and the specials: equal digests, equal ids."""
        h = hashlib.sha256(self._data)
        h.update(json.dumps(self.tokens, sort_keys=True).encode("utf-8"))
        return h.hexdigest()

    # ---- persistence --------------------------------------------------------------------------

    def save(self, out_dir: str | os.PathLike) -> None:
        """Write ``tokenizer.json`` and ``tokenizer.yaml`` into ``out_dir`` (atomically, checksummed)."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(out / HF_FILE, self._data)
        meta = {"kind": self.kind, "vocab_size": self.vocab_size,
                "specials": {role: {"token": tok, "id": self.ids[role]} for role, tok in self.tokens.items()},
                "add_bos_token": self.add_bos_token}
        if self.origin is not None:
            meta["origin"] = self.origin.as_dict()
        atomic_write_bytes(out / META_FILE, yaml.safe_dump(meta, sort_keys=False, allow_unicode=True).encode())
        record(out, [HF_FILE, META_FILE])

    @classmethod
    def load(cls, directory: str | os.PathLike) -> "HFTokenizer":
        """Load what :meth:`save` wrote; a missing, corrupt or altered file is a one-line error."""
        root = Path(directory)
        for name in (META_FILE, HF_FILE):
            if not (root / name).is_file():
                raise DataError(f"{root / name}: tokenizer file is missing")
            verify(root, name)
        meta = _read_yaml(root / META_FILE)
        specials = meta.get("specials")
        if not isinstance(specials, dict) or not all(isinstance(v, dict) and "token" in v for v in specials.values()):
            raise DataError(f"{root / META_FILE}: 'specials' must map each role to its token and id")
        # A directory written before the flag was recorded prompted with BOS first, and still does.
        add_bos = meta.get("add_bos_token", True)
        if not isinstance(add_bos, bool):
            raise DataError(f"{root / META_FILE}: 'add_bos_token' must be true or false, not {add_bos!r}")
        origin = HFOrigin.from_dict(meta["origin"], root / META_FILE) if "origin" in meta else None
        tok = cls((root / HF_FILE).read_bytes(), {r: v["token"] for r, v in specials.items()}, str(root / HF_FILE),
                  add_bos, origin)
        wrong = [r for r, v in specials.items() if v.get("id") != tok.ids[r]]
        if wrong:
            raise DataError(f"{root / META_FILE}: recorded ids of {wrong} do not match {HF_FILE}")
        return tok

    @classmethod
    def from_hf_dir(cls, where: str | os.PathLike) -> "HFTokenizer":
        """The tokenizer of a Hugging Face model directory: its ``tokenizer.json``, with the special
        tokens named in ``tokenizer_config.json`` / ``special_tokens_map.json``. BOS comes first
        where ``tokenizer.json``'s post-processor puts it first: transformers drops
        ``tokenizer_config.json``'s ``add_bos_token`` when that file exists."""
        root = Path(where)
        if not (root / HF_FILE).is_file():
            raise DataError(f"{root}: no {HF_FILE} (transduce imports tokenizers from Hugging Face's fast "
                            "tokenizer file)")
        specials: dict[str, str] = {}
        for name in SIDE_FILES:
            if (root / name).is_file():
                specials.update(_named_specials(root / name))
        return cls((root / HF_FILE).read_bytes(), specials, str(root / HF_FILE))

    def __reduce__(self):  # pickled as its file and specials (a worker process rebuilds it)
        return HFTokenizer, (self._data, self.tokens, self.name, self.add_bos_token, self.origin)

    def __repr__(self) -> str:
        return (f"HFTokenizer(kind={self.kind}, vocab_size={self.vocab_size}, specials={self.ids}, "
                f"add_bos_token={self.add_bos_token})")


def _named_specials(path: Path) -> dict[str, str]:
    """role -> token from a tokenizer_config.json or special_tokens_map.json (``bos_token`` ...)."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise DataError(f"{path}: unreadable ({one_line(err)})") from None
    found = {}
    for role in ROLES:
        value = raw.get(f"{role}_token") if isinstance(raw, dict) else None
        if isinstance(value, dict):  # an AddedToken written out: {"content": ..., ...}
            value = value.get("content")
        if isinstance(value, str):
            found[role] = value
    return found


def _read_yaml(path: Path) -> dict:
    try:
        meta = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise DataError(f"{path}: unreadable tokenizer metadata ({one_line(err)})") from None
    if not isinstance(meta, dict) or meta.get("kind") not in KINDS:
        raise DataError(f"{path}: expected a mapping with 'kind' one of {KINDS}")
    return meta
