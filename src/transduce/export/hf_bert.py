"""Export an encoder_only model to a Hugging Face ``BertForMaskedLM`` (masked-LM head),
``BertForPreTraining`` (masked-LM and next-sentence heads, ``nsp``) or
``BertForSequenceClassification`` (``n_classes`` > 0) directory: config and safetensors.

BERT is our encoder_only model with these options: post-LN layers, learned positions, erf-GELU,
an embedding LayerNorm, no embedding scaling, biases everywhere. The weights then map one for
one; a model without token types (``type_vocab_size`` 0) is written with one all-zero type row,
which is what adding nothing is. Other options are refused with a one-line error naming them.

No tokenizer is written: ours is SentencePiece and BERT's tokenizers are WordPiece, so the
directory is loaded with ``AutoModel*`` and fed our token ids (the [MASK] id is the last one).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import Tensor, nn

from ..config import ModelConfig
from ..errors import require
from ..model.encoder_only import EncoderOnly
from .base import ExportError, load_for_export, no_progress_bars
from .verify import check_close, probe_batch


def bert_incompatibilities(cfg: ModelConfig) -> list[str]:
    """The options of ``cfg`` that BERT cannot express, one phrase each."""
    want = dict(arch="encoder_only", norm="post", positions="learned", activation="gelu", bias=True,
                embed_norm=True, scale_embeddings=False)
    return [f"model.{k}={getattr(cfg, k)} (BERT has {k}={v})" for k, v in want.items() if getattr(cfg, k) != v]


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


def _linear(name: str, layer: nn.Linear) -> dict[str, Tensor]:
    return {f"{name}.weight": layer.weight.detach(), f"{name}.bias": layer.bias.detach()}


_norm = _linear  # a LayerNorm's weight and bias, under the same two names


def _layer(i: int, layer: nn.Module) -> dict[str, Tensor]:
    p = f"bert.encoder.layer.{i}"
    attn = layer.self_attn
    return {**_linear(f"{p}.attention.self.query", attn.q_proj), **_linear(f"{p}.attention.self.key", attn.k_proj),
            **_linear(f"{p}.attention.self.value", attn.v_proj),
            **_linear(f"{p}.attention.output.dense", attn.out_proj),
            **_norm(f"{p}.attention.output.LayerNorm", layer.norm1),
            **_linear(f"{p}.intermediate.dense", layer.ffn.fc1), **_linear(f"{p}.output.dense", layer.ffn.fc2),
            **_norm(f"{p}.output.LayerNorm", layer.norm2)}


def _embeddings(model: EncoderOnly) -> dict[str, Tensor]:
    embed, d = model.embed, model.config.d_model
    types = embed.token_types.weight.detach() if embed.token_types is not None else torch.zeros(1, d)
    return {"bert.embeddings.word_embeddings.weight": embed.tokens.weight.detach(),
            "bert.embeddings.position_embeddings.weight": embed.positions.weight.detach(),
            "bert.embeddings.token_type_embeddings.weight": types,
            **_norm("bert.embeddings.LayerNorm", embed.norm)}


def _heads(model: EncoderOnly) -> dict[str, Tensor]:
    if model.cls_head is not None:
        head = model.cls_head
        return {**_linear("bert.pooler.dense", head.pooler), **_linear("classifier", head.classifier)}
    head = model.mlm_head
    nsp = model.nsp_head
    return {**_linear("cls.predictions.transform.dense", head.dense),
            **_norm("cls.predictions.transform.LayerNorm", head.norm),
            "cls.predictions.decoder.weight": head.decoder.weight.detach(),
            "cls.predictions.bias": head.bias.detach(), "cls.predictions.decoder.bias": head.bias.detach(),
            **({} if nsp is None else {**_linear("bert.pooler.dense", nsp.pooler),
                                       **_linear("cls.seq_relationship", nsp.classifier)})}


def bert_state_dict(model: EncoderOnly) -> dict[str, Tensor]:
    """Our weights under BertForMaskedLM's (BertForPreTraining's, BertForSequenceClassification's) names."""
    state = {**_embeddings(model), **_heads(model)}
    for i, layer in enumerate(model.layers):
        state.update(_layer(i, layer))
    return {k: v.float().contiguous() for k, v in state.items()}


def bert_class(transformers, cfg: ModelConfig):
    if cfg.n_classes:
        return transformers.BertForSequenceClassification
    return transformers.BertForPreTraining if cfg.nsp else transformers.BertForMaskedLM


def export_hf_bert(model_dir: str | os.PathLike, out: Path) -> dict[str, object]:
    """Write a BertForMaskedLM / BertForPreTraining / BertForSequenceClassification directory for ``model_dir``
    into ``out`` and verify it."""
    transformers = require("transformers", "export")
    model, _ = load_for_export(model_dir, need_tokenizer=False)
    check_bert_compatible(model.config)
    hf = bert_class(transformers, model.config)(bert_config(model.config))
    missing, unexpected = hf.load_state_dict(bert_state_dict(model), strict=False)
    if missing or unexpected:
        raise ExportError(f"BERT weight mapping is incomplete: missing {missing[:3]}, unexpected {unexpected[:3]}")
    with no_progress_bars(transformers):
        hf.save_pretrained(out)
        return verify_hf_bert(model, out)


def probe_inputs(cfg: ModelConfig, seed: int = 0) -> tuple[Tensor, Tensor | None]:
    """BOS + random tokens + EOS of several lengths, right-padded, some tokens [MASK]; random
    token types (None without them). -> (B, T) ids, (B, T) types."""
    lengths = tuple(min(n, cfg.max_positions - 2) for n in (7, 3, 11, 1, 5, 9))  # BOS and EOS fit too
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
