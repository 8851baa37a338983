"""BERT and RoBERTa as Hugging Face writes them, both ways: our encoder_only model with BERT's
options and ``BertForMaskedLM``, ``BertForPreTraining`` (``model.nsp``),
``BertForSequenceClassification`` (``model.n_classes``), ``RobertaForMaskedLM`` and
``RobertaForSequenceClassification``; one parameter table (:func:`bert_names`) read by the export
(:data:`EXPORT`, written as BERT), the import (:data:`IMPORT`, a ``model_type`` bert or roberta
directory: config.json, weights, tokenizer.json with tokenizer_config.json or
special_tokens_map.json) and Longformer's (:mod:`~transduce.interop.longformer`); the vocabulary
order both ways in :mod:`~transduce.interop.bert_vocab`.

BERT is our encoder_only model with these options: post-LN layers, learned positions, erf-GELU,
an embedding LayerNorm, no embedding scaling, biases everywhere. The weights then map one for
one; a model without token types (``type_vocab_size`` 0) is written with one all-zero type row,
which is what adding nothing is. Other options are refused with a one-line error naming them.

An imported model (BERT's WordPiece or RoBERTa's byte-level BPE tokenizer, its ids the original's
renumbered) is written in the original checkpoint's ids with the original's tokenizer files
(:mod:`~transduce.interop.bert_vocab`), a model fine-tuned from one too; a RoBERTa as BERT
(its position table already starts at its first real position). Checked as a user reads it:
AutoTokenizer on the export gives our ids (in the export's numbering) on sample texts, and the
exported model's logits on them are ours. A SentencePiece tokenizer is not written: the directory
is then loaded with ``AutoModel*`` and fed our token ids (the [MASK] id is the last one).

Import. The architecture is config.json's ``architectures[0]``; the name table is read backwards.
BertForPreTraining keeps its next-sentence head (``model.nsp``). RoBERTa differs in three places, each mapped exactly:

- its position ids start at ``pad_token_id + 1`` (``create_position_ids_from_input_ids``): for
  right-padded rows, position i reads row ``pad + 1 + i``, so our table is RoBERTa's from that row
  (``max_positions`` that many fewer);
- its classification head is dropout, dense, tanh, dropout, out_proj on ``<s>``: BERT's pooler
  and classifier with the dropouts elsewhere (the same function when not training);
- its special ids (``<s>`` 0, ``<pad>`` 1, ``</s>`` 2, ``<unk>`` 3): reordered, below.

Vocabulary. transduce fixes its special ids (pad 0, bos 1, eos 2, unk 3) and an encoder_only
model's [MASK] is its last id, so our ids are the original's reordered: the specials first, [MASK]
last (:mod:`~transduce.interop.bert_vocab`; :func:`vocab_order` gives the original id of each of
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
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from ..config import ModelConfig
from ..data.batch import pad
from ..data.hf_tokenizer import HFOrigin, HFTokenizer
from ..errors import require
from ..model import EncoderOnly
from .base import ExportError, head_width_problems
from .bert_vocab import ORDER_ROLES, export_order, original_tokenizer_files, renumbered_tokenizer, special_order
from .hf import SAMPLE_TEXT, HFEncoder, HFExport, HFImport, HFImportError, copy_tokenizer
from .verify import check_against, encoder_probe

logger = logging.getLogger(__name__)

def bert_incompatibilities(cfg: ModelConfig) -> list[str]:
    """The options of ``cfg`` that BERT cannot express, one phrase each."""
    want = dict(arch="encoder_only", norm="post", positions="learned", activation="gelu", bias=True,
                embed_norm=True, scale_embeddings=False)
    return ([f"model.{k}={getattr(cfg, k)} (BERT has {k}={v})" for k, v in want.items() if getattr(cfg, k) != v]
            + head_width_problems(cfg, "BERT"))


def bert_config(cfg: ModelConfig, order: Tensor | None = None):
    """The BertConfig of the same shape; a classifier's ``id2label`` / ``label2id`` are its
    ``model.labels`` (a pipeline's output names), or BERT's ``LABEL_i`` for a model without them.
    ``order``: the exported id of each of ours (None: ours), for the pad id."""
    transformers = require("transformers", "export")
    labels = cfg.labels or tuple(f"LABEL_{i}" for i in range(cfg.n_classes))
    heads = (dict(id2label=dict(enumerate(labels)), label2id={name: i for i, name in enumerate(labels)})
             if cfg.n_classes else dict(num_labels=2))  # 2: BertConfig's default, unused by the masked-LM model
    return transformers.BertConfig(
        vocab_size=cfg.src_vocab_size, hidden_size=cfg.d_model, num_hidden_layers=cfg.n_encoder_layers,
        num_attention_heads=cfg.n_heads, intermediate_size=cfg.d_ff, hidden_act="gelu",
        hidden_dropout_prob=cfg.dropout, attention_probs_dropout_prob=cfg.attention_dropout,
        max_position_embeddings=cfg.max_positions, type_vocab_size=max(cfg.type_vocab_size, 1),
        layer_norm_eps=cfg.layer_norm_eps, pad_token_id=cfg.pad_id if order is None else int(order[cfg.pad_id]),
        tie_word_embeddings=cfg.tie_output, **heads,
    )


# Our encoder layer's modules -> a BertLayer's (RobertaLayer's) under ``encoder.layer.{i}``.
LAYER_NAMES = {"self_attn.q_proj": "attention.self.query", "self_attn.k_proj": "attention.self.key",
               "self_attn.v_proj": "attention.self.value", "self_attn.out_proj": "attention.output.dense",
               "norm1": "attention.output.LayerNorm", "ffn.fc1": "intermediate.dense", "ffn.fc2": "output.dense",
               "norm2": "output.LayerNorm"}
# Longformer's projections for the global tokens' rows (``model.attention.global_projections``).
GLOBAL_NAMES = {"self_attn.q_global_proj": "attention.self.query_global",
                "self_attn.k_global_proj": "attention.self.key_global",
                "self_attn.v_global_proj": "attention.self.value_global"}
# The families whose heads are RoBERTa's (lm_head, classifier.dense + out_proj).
ROBERTA_HEADS = ("roberta", "longformer")
# Our tensors with a row per vocabulary id: reordered between our ids and the original's.
VOCAB_ROWS = ("embed.tokens.weight", "mlm_head.decoder.weight", "mlm_head.bias")


def _pair(ours: str, theirs: str) -> dict[str, str]:
    """A Linear's or LayerNorm's weight and bias."""
    return {f"{ours}.{leaf}": f"{theirs}.{leaf}" for leaf in ("weight", "bias")}


def bert_names(cfg: ModelConfig, family: str = "bert") -> dict[str, str]:
    """Our parameter names -> transformers' for an encoder_only model of ``cfg``: BertForMaskedLM,
    BertForPreTraining (``nsp``), BertForSequenceClassification (``n_classes``), or with
    ``family="roberta"`` RobertaForMaskedLM / RobertaForSequenceClassification, with
    ``family="longformer"`` LongformerForMaskedLM. The export and the imports (BERT's and RoBERTa's
    here, :mod:`~transduce.interop.longformer`) read this one table."""
    p = family
    names = {"embed.tokens.weight": f"{p}.embeddings.word_embeddings.weight",
             "embed.positions.weight": f"{p}.embeddings.position_embeddings.weight",
             **_pair("embed.norm", f"{p}.embeddings.LayerNorm")}
    if cfg.type_vocab_size:
        names["embed.token_types.weight"] = f"{p}.embeddings.token_type_embeddings.weight"
    for i in range(cfg.n_encoder_layers):
        for ours, theirs in {**LAYER_NAMES, **(GLOBAL_NAMES if cfg.attention.global_projections else {})}.items():
            names.update(_pair(f"layers.{i}.{ours}", f"{p}.encoder.layer.{i}.{theirs}"))
    return {**names, **_head_names(cfg, family)}


def _head_names(cfg: ModelConfig, family: str) -> dict[str, str]:
    """The heads' names: BERT's pooler + classifier (RoBERTa's classifier.dense + out_proj: the
    same arithmetic, dropout aside), the masked-LM head, the next-sentence head."""
    roberta = family in ROBERTA_HEADS
    if cfg.n_classes:
        pooler, classifier = ("classifier.dense", "classifier.out_proj") if roberta else ("bert.pooler.dense",
                                                                                          "classifier")
        return {**_pair("cls_head.pooler", pooler), **_pair("cls_head.classifier", classifier)}
    head = "lm_head" if roberta else "cls.predictions"
    transform, norm = ("lm_head", "layer_norm") if roberta else ("cls.predictions.transform", "LayerNorm")
    names = {**_pair("mlm_head.dense", f"{transform}.dense"), **_pair("mlm_head.norm", f"{transform}.{norm}"),
             "mlm_head.decoder.weight": f"{head}.decoder.weight", "mlm_head.bias": f"{head}.decoder.bias"}
    if cfg.nsp:
        names.update({**_pair("nsp_head.pooler", "bert.pooler.dense"),
                      **_pair("nsp_head.classifier", "cls.seq_relationship")})
    return names


def bert_state_dict(model: EncoderOnly, order: Tensor | None = None) -> dict[str, Tensor]:
    """Our weights under BertForMaskedLM's (BertForPreTraining's, BertForSequenceClassification's)
    names, vocabulary rows in the exported ids (``order[i]`` that of our id i; None: ours); a model
    without token types gets one all-zero type row."""
    cfg, ours = model.config, model.state_dict()
    back = None if order is None else torch.argsort(order)              # back[exported id] = our id
    state = {theirs: ours[name] if back is None or name not in VOCAB_ROWS else ours[name][back]
             for name, theirs in bert_names(cfg).items()}
    if not cfg.type_vocab_size:
        state["bert.embeddings.token_type_embeddings.weight"] = torch.zeros(1, cfg.d_model)
    if not cfg.n_classes:
        state["cls.predictions.bias"] = state["cls.predictions.decoder.bias"]  # what transformers ties it to
    return {k: v.detach().float().contiguous() for k, v in state.items()}


def bert_class(cfg: ModelConfig) -> str:
    """The transformers class an encoder_only model of ``cfg`` exports as."""
    if cfg.n_classes:
        return "BertForSequenceClassification"
    return "BertForPreTraining" if cfg.nsp else "BertForMaskedLM"


def write_hf_tokenizer(model_dir: Path, tok, out: Path, cfg: ModelConfig, order: Tensor) -> None:
    """The files AutoTokenizer reads, for an imported tokenizer (none for a SentencePiece one): the
    original's (in its ids, ``order``); for one imported before its origin was kept, ours, read
    verbatim from ``tokenizer.json`` (``PreTrainedTokenizerFast``: BertTokenizer would rebuild the
    normaliser from defaults, lower-casing a cased WordPiece)."""
    if not isinstance(tok, HFTokenizer):
        return
    if tok.origin is None:
        copy_tokenizer(model_dir, out, tok, "PreTrainedTokenizerFast")
        return
    for name, data in original_tokenizer_files(tok, order).items():
        (out / name).write_bytes(data)


def text_checks(model: EncoderOnly, tok, out: Path, hf, order: Tensor) -> dict[str, object]:
    """What a user of ``out`` with an imported tokenizer sees: AutoTokenizer on ``out`` reads
    sample texts into our ids with [CLS] / <s> first and [SEP] / </s> last (as ``order`` numbers
    them), and the model ``hf`` gives our logits on them. ``tokenizer_differences`` (0, or an
    ExportError) and ``max_text_*``."""
    if not isinstance(tok, HFTokenizer):
        return {}
    transformers = require("transformers", "export")
    cfg = model.config
    texts = [t for t in SAMPLE_TEXT if len(tok.encode(t)) + 2 <= cfg.max_positions]
    ids = pad([tok.encode(t) for t in texts], cfg.pad_id, bos=True, eos=True)  # (B, T) what classify feeds
    enc = transformers.AutoTokenizer.from_pretrained(out)(texts, padding=True, return_tensors="pt")
    bad = [t for t, want, got in zip(texts, order[ids].tolist(), enc["input_ids"].tolist()) if want != got]
    if bad:
        raise ExportError(f"verification failed: AutoTokenizer on {out} reads {bad[0]!r} into other ids than ours")
    probe = encoder_probe(ids, torch.zeros_like(ids) if cfg.type_vocab_size else None, cfg.pad_id)
    checks = check_against(model, HFEncoder(hf, cfg, order), probe, "BERT (text through AutoTokenizer)")
    return {"tokenizer_differences": 0, **{k.replace("max_", "max_text_", 1): v for k, v in checks.items()}}


EXPORT = HFExport("BERT", bert_class, bert_incompatibilities, bert_config, bert_state_dict, write_hf_tokenizer,
                  order=lambda cfg, tok: export_order(tok, cfg.src_vocab_size), checks=text_checks)


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


def vocab_order(tokenizer: HFTokenizer, n_rows: int, where: Path) -> Tensor:
    """The original id of each of our ids (:mod:`~transduce.interop.bert_vocab`), from the
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


@dataclass(frozen=True)
class EncoderCheckpoint:
    """What a BERT, RoBERTa or Longformer import reads before the weights: transformers' class of
    it (``arch``), the parameter names' ``family`` and its ``head``, the first position row
    (``offset``: RoBERTa's pad + 1), its tokenizer (``original``), the same renumbered to our ids
    (``tokenizer``) and ``order`` (:func:`vocab_order`)."""

    arch: str
    family: str
    head: str
    offset: int
    original: HFTokenizer
    tokenizer: HFTokenizer
    order: Tensor


def read_checkpoint(where: Path, config: dict, arch: str, family: str, head: str) -> EncoderCheckpoint:
    """The :class:`EncoderCheckpoint` of ``where`` whose config.json holds ``config``: the
    directory's tokenizer renumbered to our ids keeps where it came from (its origin)."""
    original = HFTokenizer.from_hf_dir(where)
    order = vocab_order(original, int(config["vocab_size"]), where)
    ours = HFTokenizer(renumbered_tokenizer(original.data, order), original.tokens, str(where / "tokenizer.json"),
                       original.add_bos_token, HFOrigin.read(where, original.ids))
    offset = int(config["pad_token_id"]) + 1 if family in ROBERTA_HEADS else 0
    return EncoderCheckpoint(arch, family, head, offset, original, ours, order)


def bert_model_config(config: dict, where: Path, state: dict[str, Tensor], ckpt: EncoderCheckpoint,
                      tied: bool | None = None) -> ModelConfig:
    """Our ModelConfig for a BertConfig / RobertaConfig / LongformerConfig (as a dict), full
    attention; ``tied``: the masked-LM decoder is the token embedding (None: as in ``state``)."""
    labels = ()
    if ckpt.head == "classify":
        id2label = config.get("id2label") or {str(i): f"LABEL_{i}" for i in range(int(config.get("num_labels", 2)))}
        labels = tuple(str(id2label[k]) for k in sorted(id2label, key=int))
    return ModelConfig(
        arch="encoder_only", src_vocab_size=int(config["vocab_size"]), tgt_vocab_size=int(config["vocab_size"]),
        d_model=int(config["hidden_size"]), n_heads=int(config["num_attention_heads"]),
        n_encoder_layers=int(config["num_hidden_layers"]), n_decoder_layers=0,
        d_ff=int(config["intermediate_size"]), dropout=float(config.get("hidden_dropout_prob", 0.1)),
        attention_dropout=float(config.get("attention_probs_dropout_prob", 0.1)),
        max_positions=int(config["max_position_embeddings"]) - ckpt.offset, norm="post", positions="learned",
        activation="gelu", embed_norm=True, scale_embeddings=False,
        layer_norm_eps=float(config.get("layer_norm_eps", 1e-12)),
        type_vocab_size=int(config.get("type_vocab_size", 2)), n_classes=len(labels), labels=labels,
        nsp=ckpt.head == "nsp", share_embeddings=True,
        tie_output=is_tied(state, ckpt.family, ckpt.head) if tied is None else tied)


def is_tied(state: dict[str, Tensor], family: str, head: str) -> bool:
    """Whether the masked-LM decoder is the token embedding: absent, or equal."""
    if head == "classify":
        return True
    decoder = state.get("lm_head.decoder.weight" if family in ROBERTA_HEADS else "cls.predictions.decoder.weight")
    embedding = state.get(f"{family}.embeddings.word_embeddings.weight")
    return decoder is None or (embedding is not None and torch.equal(decoder, embedding))


def our_bert_state(state: dict[str, Tensor], cfg: ModelConfig, ckpt: EncoderCheckpoint, where: Path
                   ) -> dict[str, Tensor]:
    """The original's tensors under our names: vocabulary rows in our order, positions from row
    ``ckpt.offset``; a tied decoder is the embedding (not loaded twice)."""
    family, order = ckpt.family, ckpt.order
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
            t = t[ckpt.offset:]
        ours[name] = t.contiguous()
    return ours


PROBE_TEXTS = ("A man in an orange hat starring at something.", "Zwei Männer stehen am Herd.", "",
               "  runs   of spaces ", "Café 👍🏽 東京 \t\x07", "[CLS] <s> special-looking text </s> [SEP]")


def check_same_ids(original: HFTokenizer, ours: HFTokenizer, order: Tensor) -> int:
    """0, or an HFImportError: the renumbered tokenizer gives the original's ids (in our order) on
    the probe texts."""
    for text in PROBE_TEXTS:
        want, got = original.encode(text), ours.encode(text)
        if [int(order[i]) for i in got] != want:
            raise HFImportError(f"verification failed: the renumbered tokenizer segments {text!r} differently")
    return 0


def bert_checkpoint(where: Path, config: dict) -> EncoderCheckpoint:
    """The :class:`EncoderCheckpoint` of a BERT or RoBERTa directory (:data:`ARCHITECTURES`)."""
    return read_checkpoint(where, config, *bert_architecture(config, where))


def tokenizer_checks(where: Path, ckpt: EncoderCheckpoint, tokenizer: HFTokenizer) -> dict[str, object]:
    return {"tokenizer_differences": check_same_ids(ckpt.original, ckpt.tokenizer, ckpt.order)}


IMPORT = HFImport(bert_checkpoint, bert_model_config, our_bert_state, lambda where, ckpt: (ckpt.tokenizer, {}),
                  lambda ckpt: ckpt.arch, lambda ckpt: (ckpt.order, ckpt.order),
                  {"hidden_act": "gelu", "position_embedding_type": "absolute", "is_decoder": False}, "transduce maps",
                  checks=tokenizer_checks)
