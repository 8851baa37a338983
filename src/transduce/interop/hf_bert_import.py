"""Import a Hugging Face BERT or RoBERTa directory (``BertForMaskedLM``, ``BertForPreTraining``,
``BertForSequenceClassification``, ``RobertaForMaskedLM``, ``RobertaForSequenceClassification``:
config.json, model.safetensors or pytorch_model.bin, tokenizer.json with tokenizer_config.json or
special_tokens_map.json) as a transduce encoder_only model with its tokenizer, verified against
transformers before anything is written.

The architecture is config.json's ``architectures[0]``. BERT and RoBERTa are our encoder_only
model with BERT's options (:mod:`~transduce.interop.hf_bert`, whose name table :func:`bert_names`
this reads backwards); BertForPreTraining keeps its next-sentence head (``model.nsp``). RoBERTa
differs in three places, each mapped exactly:

- its position ids start at ``pad_token_id + 1`` (``create_position_ids_from_input_ids``): for
  right-padded rows, position i reads row ``pad + 1 + i``, so our table is RoBERTa's from that row
  (``max_positions`` that many fewer);
- its classification head is dropout, dense, tanh, dropout, out_proj on ``<s>``: BERT's pooler
  and classifier with the dropouts elsewhere (the same function when not training);
- its special ids (``<s>`` 0, ``<pad>`` 1, ``</s>`` 2, ``<unk>`` 3): reordered, below.

Vocabulary. transduce fixes its special ids (pad 0, bos 1, eos 2, unk 3) and an encoder_only
model's [MASK] is its last id, so our ids are the original's reordered: the specials first, [MASK]
last (:mod:`~transduce.interop.hf_bert_vocab`; :func:`vocab_order` gives the original id of each of
ours). The tokenizer (WordPiece or byte-level BPE, :class:`~transduce.data.hf_tokenizer.HFTokenizer`)
is the original tokenizer.json with its ids renumbered the same way: it segments exactly as the
original, and its ids are ours. ``transduce classify``, masked-LM evaluation and training then
read text as transformers' tokenizer does. The tokenizer keeps the original's special ids and
tokenizer_config.json / special_tokens_map.json (its ``origin``), so ``export --format hf`` gives
the checkpoint back in its own ids with its own tokenizer files.

Not supported (one-line errors): another ``hidden_act`` than ``gelu``, relative position
embeddings, a decoder (``is_decoder``), an attention width that does not divide into the heads.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch import Tensor

from typing import TYPE_CHECKING

from ..config import ModelConfig
from ..errors import ConfigError, one_line, require
from ..model import EncoderOnly, save_model
from ..model.io import load_state_checked
from .base import staging_dir, torch_threads
from .hf_bert import ROBERTA_HEADS, VOCAB_ROWS, bert_names, verify_bert
from .hf_bert_vocab import ORDER_ROLES, renumbered_tokenizer, special_order
from .hf_read import HFImportError, load_hf_model, read_weights, refuse_unsupported

if TYPE_CHECKING:
    from ..data.hf_tokenizer import HFTokenizer

logger = logging.getLogger(__name__)

# architecture -> (family, head): what an importable config.json names
ARCHITECTURES = {"BertForMaskedLM": ("bert", "mlm"), "BertForPreTraining": ("bert", "nsp"),
                 "BertForSequenceClassification": ("bert", "classify"),
                 "RobertaForMaskedLM": ("roberta", "mlm"), "RobertaForSequenceClassification": ("roberta", "classify")}


def bert_architecture(config: dict, where: Path) -> tuple[str, str, str]:
    """(architecture, family, head) of a BERT or RoBERTa config.json; a one-line error otherwise."""
    names = config.get("architectures") or []
    arch = names[0] if names else None
    if arch not in ARCHITECTURES:
        raise HFImportError(f"{where / 'config.json'}: architectures={names or None} is not importable for "
                            f"model_type={config.get('model_type')} (supported: {', '.join(ARCHITECTURES)})")
    return (arch, *ARCHITECTURES[arch])


def vocab_order(tokenizer: "HFTokenizer", n_rows: int, where: Path) -> Tensor:
    """The original id of each of our ids (:mod:`~transduce.interop.hf_bert_vocab`), from the
    tokenizer's special tokens: pad, [CLS] / <s>, [SEP] / </s>, [UNK] / <unk> first, [MASK] / <mask> last."""
    missing = [role for role in ORDER_ROLES if role not in tokenizer.tokens]
    if missing:
        raise HFImportError(f"{where}: the tokenizer names no {', '.join(missing)} token (tokenizer_config.json "
                            "or special_tokens_map.json)")
    specials = {role: tokenizer.ids[role] for role in ORDER_ROLES}
    if len(set(specials.values())) < len(specials) or tokenizer.vocab_size > n_rows:
        raise HFImportError(f"{where}: the tokenizer's {tokenizer.vocab_size} tokens (specials {specials}) do not "
                            f"fit the model's vocab_size={n_rows} as distinct ids")
    return special_order(specials, n_rows)


def bert_model_config(config: dict, where: Path, family: str, head: str, tied: bool) -> tuple[ModelConfig, int]:
    """Our ModelConfig for a BertConfig / RobertaConfig / LongformerConfig (as a dict), full
    attention, and the first position row."""
    name = where / "config.json"
    refuse_unsupported(config, name, {"hidden_act": "gelu", "position_embedding_type": "absolute",
                                      "is_decoder": False}, "transduce maps")
    try:
        offset = int(config["pad_token_id"]) + 1 if family in ROBERTA_HEADS else 0
        labels = ()
        if head == "classify":
            id2label = config.get("id2label") or {str(i): f"LABEL_{i}" for i in range(int(config.get("num_labels", 2)))}
            labels = tuple(str(id2label[k]) for k in sorted(id2label, key=int))
        return ModelConfig(
            arch="encoder_only", src_vocab_size=int(config["vocab_size"]), tgt_vocab_size=int(config["vocab_size"]),
            d_model=int(config["hidden_size"]), n_heads=int(config["num_attention_heads"]),
            n_encoder_layers=int(config["num_hidden_layers"]), n_decoder_layers=0,
            d_ff=int(config["intermediate_size"]), dropout=float(config.get("hidden_dropout_prob", 0.1)),
            attention_dropout=float(config.get("attention_probs_dropout_prob", 0.1)),
            max_positions=int(config["max_position_embeddings"]) - offset, norm="post", positions="learned",
            activation="gelu", embed_norm=True, scale_embeddings=False,
            layer_norm_eps=float(config.get("layer_norm_eps", 1e-12)),
            type_vocab_size=int(config.get("type_vocab_size", 2)), n_classes=len(labels), labels=labels,
            nsp=head == "nsp", tie_output=tied, share_embeddings=True), offset
    except KeyError as e:
        raise HFImportError(f"{name}: missing key {e.args[0]!r}") from None
    except (ConfigError, TypeError, ValueError) as e:
        raise HFImportError(f"{name}: does not map to a valid transduce config ({one_line(e)})") from None


def is_tied(state: dict[str, Tensor], family: str, head: str) -> bool:
    """Whether the masked-LM decoder is the token embedding: absent, or equal."""
    if head == "classify":
        return True
    decoder = state.get("lm_head.decoder.weight" if family in ROBERTA_HEADS else "cls.predictions.decoder.weight")
    embedding = state.get(f"{family}.embeddings.word_embeddings.weight")
    return decoder is None or (embedding is not None and torch.equal(decoder, embedding))


def our_bert_state(state: dict[str, Tensor], cfg: ModelConfig, family: str, order: Tensor,
                   offset: int) -> dict[str, Tensor]:
    """The original's tensors under our names: vocabulary rows in our order, positions from row
    ``offset``; a tied decoder is the embedding (not loaded twice)."""
    ours = {}
    for name, theirs in bert_names(cfg, family).items():
        if name == "mlm_head.decoder.weight" and cfg.tie_output:
            continue
        if theirs not in state and theirs.endswith(".decoder.bias"):  # saved once, as the tied-to bias
            theirs = theirs.replace(".decoder.bias", ".bias")
        if theirs not in state:
            raise HFImportError(f"{family} weights lack tensor {theirs}")
        t = state[theirs]
        if name in VOCAB_ROWS:
            if t.shape[0] != len(order):
                raise HFImportError(f"{family} weights: {theirs} has {t.shape[0]} rows, but config.json's "
                                    f"vocab_size is {len(order)}")
            t = t[order]
        elif name == "embed.positions.weight":
            t = t[offset:]
        ours[name] = t.contiguous()
    return ours


def import_bert(where: Path, config: dict, out, force: bool = False) -> dict[str, object]:
    """:func:`~transduce.interop.hf_import.import_hf` for a BERT or RoBERTa directory ``where``
    whose config.json holds ``config``."""
    arch, family, head = bert_architecture(config, where)
    state = read_weights(where)
    cfg, offset = bert_model_config(config, where, family, head, is_tied(state, family, head))
    return write_encoder_import(where, arch, out, force, our_bert_state, state, cfg, family, offset,
                                verify_bert_import)


def imported_tokenizer(where: Path, n_rows: int) -> tuple["HFTokenizer", "HFTokenizer", Tensor]:
    """The directory's tokenizer, the same renumbered to our ids (keeping where it came from), and
    :func:`vocab_order`."""
    from ..data.hf_tokenizer import HFOrigin, HFTokenizer

    original = HFTokenizer.from_hf_dir(where)
    order = vocab_order(original, n_rows, where)
    ours = HFTokenizer(renumbered_tokenizer(original.data, order), original.tokens, str(where / "tokenizer.json"),
                       original.add_bos_token, HFOrigin.read(where, original.ids))
    return original, ours, order


PROBE_TEXTS = ("A man in an orange hat starring at something.", "Zwei Männer stehen am Herd.", "",
               "  runs   of spaces ", "Café 👍🏽 東京 \t\x07", "[CLS] <s> special-looking text </s> [SEP]")


def check_same_ids(original: "HFTokenizer", ours: "HFTokenizer", order: Tensor) -> int:
    """0, or an HFImportError: the renumbered tokenizer gives the original's ids (in our order) on
    the probe texts."""
    for text in PROBE_TEXTS:
        want, got = original.encode(text), ours.encode(text)
        if [int(order[i]) for i in got] != want:
            raise HFImportError(f"verification failed: the renumbered tokenizer segments {text!r} differently")
    return 0


def verify_bert_import(model: EncoderOnly, hf, order: Tensor, atol: float = 1e-4) -> dict[str, object]:
    """The imported model against the transformers model it came from (:func:`~.hf_bert.verify_bert`)."""
    return verify_bert(model, hf, order, "imported", atol)


def write_encoder_import(where: Path, arch: str, out, force: bool, mapping, state: dict, cfg, family: str,
                         offset: int, verify) -> dict[str, object]:
    """The end of an encoder import (BERT, RoBERTa, Longformer): ``state`` mapped by ``mapping`` into
    an :class:`EncoderOnly` of ``cfg`` with the renumbered tokenizer, checked by ``verify`` against
    transformers' ``arch`` model of ``where`` and the original tokenizer, then written to ``out``."""
    original, tokenizer, order = imported_tokenizer(where, cfg.src_vocab_size)
    model = EncoderOnly(cfg)
    load_state_checked(model, mapping(state, cfg, family, order, offset), f"{where} (mapped to transduce)")
    model.eval()
    with staging_dir(out, force) as tmp, torch_threads(1):
        transformers = require("transformers", "export", "transduce import")
        checks = verify(model, load_hf_model(getattr(transformers, arch), where), order)
        checks["tokenizer_differences"] = check_same_ids(original, tokenizer, order)
        save_model(model, tmp)
        tokenizer.save(tmp)
    logger.info("imported %s (%s) into %s (%s)", where, arch, out, ", ".join(f"{k}={v}" for k, v in checks.items()))
    return checks
