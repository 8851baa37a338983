"""Export an encoder_only model to a Hugging Face ``BertForMaskedLM`` (masked-LM head),
``BertForPreTraining`` (masked-LM and next-sentence heads, ``nsp``) or
``BertForSequenceClassification`` (``n_classes`` > 0) directory: config and safetensors.

BERT is our encoder_only model with these options: post-LN layers, learned positions, erf-GELU,
an embedding LayerNorm, no embedding scaling, biases everywhere. The weights then map one for
one; a model without token types (``type_vocab_size`` 0) is written with one all-zero type row,
which is what adding nothing is. Other options are refused with a one-line error naming them.

A model with a Hugging Face tokenizer (an imported BERT's WordPiece or RoBERTa's byte-level BPE,
its ids ours) is written with it, and AutoTokenizer on the export is checked to split as ours. A
SentencePiece tokenizer is not written: the directory is then loaded with ``AutoModel*`` and fed
our token ids (the [MASK] id is the last one).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import Tensor

from ..config import ModelConfig
from ..data.hf_tokenizer import HFTokenizer
from ..errors import require
from ..model.encoder_only import EncoderOnly
from .base import ExportError, head_width_problems, load_for_export, no_progress_bars
from .hf_gpt2 import copy_tokenizer, hf_tokenizer_differences
from .verify import check_close, probe_batch


def bert_incompatibilities(cfg: ModelConfig) -> list[str]:
    """The options of ``cfg`` that BERT cannot express, one phrase each."""
    want = dict(arch="encoder_only", norm="post", positions="learned", activation="gelu", bias=True,
                embed_norm=True, scale_embeddings=False)
    return ([f"model.{k}={getattr(cfg, k)} (BERT has {k}={v})" for k, v in want.items() if getattr(cfg, k) != v]
            + head_width_problems(cfg, "BERT"))


def check_bert_compatible(cfg: ModelConfig) -> None:
    """Raise ExportError naming every option BERT cannot express."""
    problems = bert_incompatibilities(cfg)
    if problems:
        raise ExportError(f"cannot export to Hugging Face BERT: {'; '.join(problems)}")


def bert_config(cfg: ModelConfig):
    """The BertConfig of the same shape; a classifier's ``id2label`` / ``label2id`` are its
    ``model.labels`` (a pipeline's output names), or BERT's ``LABEL_i`` for a model without them."""
    transformers = require("transformers", "export")
    labels = cfg.labels or tuple(f"LABEL_{i}" for i in range(cfg.n_classes))
    heads = (dict(id2label=dict(enumerate(labels)), label2id={name: i for i, name in enumerate(labels)})
             if cfg.n_classes else dict(num_labels=2))  # 2: BertConfig's default, unused by the masked-LM model
    return transformers.BertConfig(
        vocab_size=cfg.src_vocab_size, hidden_size=cfg.d_model, num_hidden_layers=cfg.n_encoder_layers,
        num_attention_heads=cfg.n_heads, intermediate_size=cfg.d_ff, hidden_act="gelu",
        hidden_dropout_prob=cfg.dropout, attention_probs_dropout_prob=cfg.attention_dropout,
        max_position_embeddings=cfg.max_positions, type_vocab_size=max(cfg.type_vocab_size, 1),
        layer_norm_eps=cfg.layer_norm_eps, pad_token_id=cfg.pad_id, tie_word_embeddings=cfg.tie_output, **heads,
    )


# Our encoder layer's modules -> a BertLayer's (RobertaLayer's) under ``encoder.layer.{i}``.
LAYER_NAMES = {"self_attn.q_proj": "attention.self.query", "self_attn.k_proj": "attention.self.key",
               "self_attn.v_proj": "attention.self.value", "self_attn.out_proj": "attention.output.dense",
               "norm1": "attention.output.LayerNorm", "ffn.fc1": "intermediate.dense", "ffn.fc2": "output.dense",
               "norm2": "output.LayerNorm"}
# Longformer's projections for the global tokens' rows (``model.global_projections``).
GLOBAL_NAMES = {"self_attn.q_global_proj": "attention.self.query_global",
                "self_attn.k_global_proj": "attention.self.key_global",
                "self_attn.v_global_proj": "attention.self.value_global"}
# The families whose heads are RoBERTa's (lm_head, classifier.dense + out_proj).
ROBERTA_HEADS = ("roberta", "longformer")


def _pair(ours: str, theirs: str) -> dict[str, str]:
    """A Linear's or LayerNorm's weight and bias."""
    return {f"{ours}.{leaf}": f"{theirs}.{leaf}" for leaf in ("weight", "bias")}


def bert_names(cfg: ModelConfig, family: str = "bert") -> dict[str, str]:
    """Our parameter names -> transformers' for an encoder_only model of ``cfg``: BertForMaskedLM,
    BertForPreTraining (``nsp``), BertForSequenceClassification (``n_classes``), or with
    ``family="roberta"`` RobertaForMaskedLM / RobertaForSequenceClassification, with
    ``family="longformer"`` LongformerForMaskedLM. The export and the imports
    (:mod:`~transduce.export.hf_bert_import`, :mod:`~transduce.export.hf_longformer_import`) read
    this one table."""
    p = family
    names = {"embed.tokens.weight": f"{p}.embeddings.word_embeddings.weight",
             "embed.positions.weight": f"{p}.embeddings.position_embeddings.weight",
             **_pair("embed.norm", f"{p}.embeddings.LayerNorm")}
    if cfg.type_vocab_size:
        names["embed.token_types.weight"] = f"{p}.embeddings.token_type_embeddings.weight"
    for i in range(cfg.n_encoder_layers):
        for ours, theirs in {**LAYER_NAMES, **(GLOBAL_NAMES if cfg.global_projections else {})}.items():
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


def bert_state_dict(model: EncoderOnly) -> dict[str, Tensor]:
    """Our weights under BertForMaskedLM's (BertForPreTraining's, BertForSequenceClassification's)
    names; a model without token types gets one all-zero type row."""
    cfg, ours = model.config, model.state_dict()
    state = {theirs: ours[name] for name, theirs in bert_names(cfg).items()}
    if not cfg.type_vocab_size:
        state["bert.embeddings.token_type_embeddings.weight"] = torch.zeros(1, cfg.d_model)
    if not cfg.n_classes:
        state["cls.predictions.bias"] = state["cls.predictions.decoder.bias"]  # what transformers ties it to
    return {k: v.detach().float().contiguous() for k, v in state.items()}


def bert_class(transformers, cfg: ModelConfig):
    if cfg.n_classes:
        return transformers.BertForSequenceClassification
    return transformers.BertForPreTraining if cfg.nsp else transformers.BertForMaskedLM


def export_hf_bert(model_dir: str | os.PathLike, out: Path) -> dict[str, object]:
    """Write a BertForMaskedLM / BertForPreTraining / BertForSequenceClassification directory for ``model_dir``
    into ``out`` and verify it."""
    transformers = require("transformers", "export")
    model, tok = load_for_export(model_dir, need_tokenizer=False)
    check_bert_compatible(model.config)
    hf = bert_class(transformers, model.config)(bert_config(model.config))
    missing, unexpected = hf.load_state_dict(bert_state_dict(model), strict=False)
    if missing or unexpected:
        raise ExportError(f"BERT weight mapping is incomplete: missing {missing[:3]}, unexpected {unexpected[:3]}")
    with no_progress_bars(transformers):
        hf.save_pretrained(out)
        checks = verify_hf_bert(model, out)
        if isinstance(tok, HFTokenizer):  # an imported tokenizer: AutoTokenizer reads it beside the model
            kind = "BertTokenizer" if tok.kind == "wordpiece" else "RobertaTokenizer"
            copy_tokenizer(Path(model_dir), out, tok, kind)
            checks["tokenizer_differences"] = hf_tokenizer_differences(tok, out)
        return checks


def probe_inputs(cfg: ModelConfig, seed: int = 0, lengths: tuple[int, ...] = (7, 3, 11, 1, 5, 9)
                 ) -> tuple[Tensor, Tensor | None]:
    """BOS + random tokens + EOS of several ``lengths``, right-padded, some tokens [MASK]; random
    token types (None without them). -> (B, T) ids, (B, T) types."""
    lengths = tuple(min(n, cfg.max_positions - 2) for n in lengths)  # BOS and EOS fit too
    ids = probe_batch(cfg.src_vocab_size - 1, cfg.pad_id, cfg.eos_id, lengths, seed)
    ids = torch.cat([torch.full((ids.shape[0], 1), cfg.bos_id), ids], dim=1)  # (B, T)
    g = torch.Generator().manual_seed(seed + 1)
    masked = (torch.rand(ids.shape, generator=g) < 0.2) & (ids > cfg.eos_id)
    ids = ids.masked_fill(masked, cfg.src_vocab_size - 1)
    if not cfg.type_vocab_size:
        return ids, None
    return ids, torch.randint(cfg.type_vocab_size, ids.shape, generator=g)


@torch.no_grad()
def verify_hf_bert(model: EncoderOnly, out: Path, atol: float = 1e-4) -> dict[str, object]:
    """Reload ``out`` with transformers; compare its logits with the eager model's on padded
    probes with token types."""
    transformers = require("transformers", "export")
    cfg = model.config
    hf = bert_class(transformers, cfg).from_pretrained(out).eval()
    ids, types = probe_inputs(cfg)
    out = hf(input_ids=ids, attention_mask=(ids != cfg.pad_id).long(), token_type_ids=types)
    states = model(ids, types)
    if cfg.n_classes:
        return {"max_class_logit_diff": check_close("BERT class logits", out.logits, model.classify(states), atol)}
    if not cfg.nsp:
        return {"max_logit_diff": check_close("BERT masked-LM logits", out.logits, model.mlm_logits(states), atol)}
    return {"max_logit_diff": check_close("BERT masked-LM logits", out.prediction_logits, model.mlm_logits(states),
                                          atol),
            "max_nsp_logit_diff": check_close("BERT next-sentence logits", out.seq_relationship_logits,
                                              model.next_sentence_logits(states), atol)}
