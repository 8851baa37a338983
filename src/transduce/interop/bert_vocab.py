"""The vocabulary of an imported BERT, RoBERTa or Longformer, both ways: the import reorders the
original checkpoint's ids into ours, and the export puts them back.

transduce fixes its special ids (pad 0, bos 1, eos 2, unk 3) and an encoder_only model's [MASK]
is its last id. Our ids are the original's reordered::

    ours 0 = pad   1 = [CLS] / <s>   2 = [SEP] / </s>   3 = [UNK] / <unk>
    ours 4.. = every other id in order   ours V-1 = [MASK] / <mask>

``order[i]``, the original id of our id i, follows from the five specials' original ids
(:func:`special_order`). The import takes the model's vocabulary rows and its ``tokenizer.json``
(:func:`renumbered_tokenizer`) into our order and keeps, with the tokenizer, those ids and the
files ``AutoTokenizer`` read beside ``tokenizer.json``
(:class:`~transduce.data.hf_tokenizer.HFOrigin`). The export reads them back
(:func:`export_order`, :func:`original_tokenizer_files`): the rows and ``tokenizer.json`` in the
original's ids again, its ``tokenizer_config.json`` (the tokenizer class, ``do_lower_case``...)
and ``special_tokens_map.json`` as they were. A model fine-tuned from an import keeps its
tokenizer, so it exports in the original's ids too.

Legend: V vocabulary.
"""

from __future__ import annotations

import json
from typing import Mapping

import torch
from torch import Tensor

from ..data.hf_tokenizer import HFTokenizer
from .base import ExportError

# Our ids 0..3 are these roles' tokens; ours V-1 is the mask token.
FIRST_ROLES = ("pad", "cls", "sep", "unk")
ORDER_ROLES = (*FIRST_ROLES, "mask")
# The transformers class of each tokenizer kind, for a tokenizer_config.json that names none.
TOKENIZER_CLASSES = {"wordpiece": "BertTokenizer", "byte_level_bpe": "RobertaTokenizer"}


def special_order(ids: Mapping[str, int], n_rows: int) -> Tensor:
    """``order`` for a vocabulary of ``n_rows`` ids whose pad, cls, sep, unk and mask tokens have
    the original ``ids`` (role -> id, distinct, below ``n_rows``). (V,)"""
    first = [ids[role] for role in FIRST_ROLES]
    mask = ids["mask"]
    return torch.tensor(first + [i for i in range(n_rows) if i not in first and i != mask] + [mask])


def renumbered_tokenizer(data: bytes, order: Tensor) -> bytes:
    """A tokenizer.json with every id replaced by ours (``order[ours]`` is the original id): the
    model's vocabulary, the added tokens, the post-processor's and padding's special ids. With
    ``torch.argsort(order)`` it is the way back: ours replaced by the original ids."""
    new = torch.argsort(order).tolist()                                  # new[original id] = our id
    raw = json.loads(data.decode("utf-8"))
    model = raw.get("model") or {}
    model["vocab"] = {token: new[int(i)] for token, i in (model.get("vocab") or {}).items()}
    for added in raw.get("added_tokens") or []:
        added["id"] = new[int(added["id"])]
    _renumber_processor(raw.get("post_processor"), new)
    if isinstance(raw.get("padding"), dict) and "pad_id" in raw["padding"]:
        raw["padding"]["pad_id"] = new[int(raw["padding"]["pad_id"])]
    return json.dumps(raw, ensure_ascii=False).encode("utf-8")


def _renumber_processor(proc, new: list[int]) -> None:
    """BertProcessing / RobertaProcessing (``cls``, ``sep``: [token, id]), TemplateProcessing
    (``special_tokens``) and Sequence (``processors``) renumbered in place."""
    if not isinstance(proc, dict):
        return
    for key in ("cls", "sep"):
        if isinstance(proc.get(key), list):
            proc[key][1] = new[int(proc[key][1])]
    for spec in (proc.get("special_tokens") or {}).values():
        spec["ids"] = [new[int(i)] for i in spec.get("ids", [])]
    for inner in proc.get("processors") or []:
        _renumber_processor(inner, new)


def export_order(tok, n_rows: int) -> Tensor:
    """The exported id of each of our ``n_rows`` ids: the original checkpoint's for a tokenizer
    imported with its ids renumbered (an :class:`HFTokenizer` with an origin), else ours. An
    ExportError if the recorded origin does not fit the tokenizer and the model. (V,)"""
    origin = tok.origin if isinstance(tok, HFTokenizer) else None
    if origin is None:
        return torch.arange(n_rows)
    ids = origin.ids
    fits = (all(role in ids for role in ORDER_ROLES) and len({ids[r] for r in ORDER_ROLES}) == len(ORDER_ROLES)
            and all(0 <= ids[r] < n_rows for r in ORDER_ROLES))
    order = special_order(ids, n_rows) if fits else None
    if order is None or any(int(order[tok.ids[role]]) != i for role, i in ids.items() if role in tok.ids):
        raise ExportError(f"{tok.name}: the original ids recorded with the tokenizer ({ids}) do not fit its "
                          f"specials ({tok.ids}) and the model's {n_rows} ids")
    return order


def original_tokenizer_files(tok: HFTokenizer, order: Tensor) -> dict[str, bytes]:
    """The files of the tokenizer ``tok`` was imported from: file name -> bytes. ``tokenizer.json``
    in the original's ids (``order``), the files read beside it as they were, and a
    ``tokenizer_config.json`` naming the class of ``tok``'s kind where the original named none
    (AutoTokenizer would otherwise take the export's ``model_type``, bert, for a RoBERTa's)."""
    files = {"tokenizer.json": renumbered_tokenizer(tok.data, torch.argsort(order))}
    files.update({name: text.encode("utf-8") for name, text in tok.origin.files.items()})
    config = json.loads(files.get("tokenizer_config.json", b"{}"))
    if "tokenizer_class" not in config:
        config["tokenizer_class"] = TOKENIZER_CLASSES[tok.kind]
        files["tokenizer_config.json"] = json.dumps(config, ensure_ascii=False, indent=1).encode("utf-8")
    return files
