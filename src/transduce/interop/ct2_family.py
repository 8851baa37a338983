"""Export a decoder-only (GPT) or encoder-only (BERT) model to CTranslate2, imported ones included.

A decoder-only model is a ``TransformerDecoderModelSpec`` (the spec CTranslate2's own GPT-2
converter fills), run by ``ctranslate2.Generator``: its logits (``forward_batch``) and greedy
continuations (``generate_batch``) are checked against ours.

An encoder-only model is a ``TransformerEncoderModelSpec`` (the spec of CTranslate2's BERT
converter, which converts ``BertModel``): embeddings, the token types as a second embedding added
to the first (RoBERTa's single type is folded into the position table), the layers and BERT's
pooler where the model has one (a classifier's or the next-sentence head's), run by
``ctranslate2.Encoder``, whose outputs are the final states and the pooled output. The heads after
them, masked-LM, classification or next-sentence, are not part of that spec, so they are not in
the export (a warning line says so): a CTranslate2 user applies them to ``pooler_output`` or
``last_hidden_state``, as with a converted BERT.

The layers are filled by the translation exporter's functions (:mod:`~transduce.interop.ct2`).
The vocabulary is the tokenizer's pieces by id (an id without a distinct piece gets
``<id_N>``), so text tokenized with the model's tokenizer feeds either runtime; its files
are copied alongside.

Legend: B batch, T length, D d_model.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..data.tokenizer import UNK_ID
from ..errors import require
from ..model.layers import GATED
from .base import ExportError, load_for_export
from .ct2 import ct2_activation, as_numpy, set_attention_options, set_encoder_layer, set_ffn, set_inputs, \
    set_linear, set_norm, set_self_attention
from .verify import Probe, Reference, check_against, default_probe

logger = logging.getLogger(__name__)


def _common(cfg) -> dict:
    rope = dict(rotary_dim=0, rotary_interleave=False, rotary_base=cfg.rope_base) if cfg.positions == "rope" else {}
    return dict(pre_norm=cfg.norm == "pre", activation=ct2_activation(cfg), ffn_glu=cfg.activation in GATED,
                head_dim=cfg.head_dim, rms_norm=cfg.norm_kind == "rms", layernorm_embedding=cfg.embed_norm, **rope)


def decoder_lm_spec(model: nn.Module):
    """A filled ``TransformerDecoderModelSpec`` (no vocabulary yet) for a decoder-only ``model``."""
    ts = require("ctranslate2.specs.transformer_spec", "export")
    cfg = model.config
    decoder = ts.TransformerDecoderSpec(cfg.n_decoder_layers, cfg.n_heads, with_encoder_attention=False,
                                        **_common(cfg))
    set_inputs(decoder, model.tgt_embed, cfg)
    if cfg.embed_norm:
        set_norm(decoder.layernorm_embedding, model.tgt_embed.norm)
    for spec, layer in zip(decoder.layer, model.decoder_layers):
        set_self_attention(spec.self_attention, layer.self_attn, layer.norm1)
        set_ffn(spec.ffn, layer.ffn, layer.norm3)
    if cfg.norm == "pre":
        set_norm(decoder.layer_norm, model.decoder_norm)
    set_attention_options(decoder, None, cfg)
    set_linear(decoder.projection, model.output_proj)
    return ts.TransformerDecoderModelSpec(decoder)


def encoder_model_spec(model: nn.Module):
    """A filled ``TransformerEncoderModelSpec`` (no vocabulary yet) for an encoder-only ``model``:
    the layers and the pooler, no head (the module docstring)."""
    ts = require("ctranslate2.specs.transformer_spec", "export")
    common = require("ctranslate2.specs.common_spec", "export")
    cfg = model.config
    types = cfg.type_vocab_size >= 2
    if cfg.type_vocab_size == 1 and cfg.positions not in ("learned", "sinusoidal"):
        raise ExportError(f"cannot export to CTranslate2: model.type_vocab_size=1 with model.positions="
                          f"{cfg.positions} (the single token type is folded into a position table)")
    encoder = ts.TransformerEncoderSpec(cfg.n_encoder_layers, cfg.n_heads, num_source_embeddings=2 if types else 1,
                                        embeddings_merge=common.EmbeddingsMerge.ADD, **_common(cfg))
    set_inputs(encoder, model.embed, cfg)
    if types:
        encoder.embeddings[1].weight = as_numpy(model.embed.token_types.weight)
    elif cfg.type_vocab_size == 1:
        encoder.position_encodings.encodings = encoder.position_encodings.encodings + \
            as_numpy(model.embed.token_types.weight[0])
    if cfg.embed_norm:
        set_norm(encoder.layernorm_embedding, model.embed.norm)
    for spec, layer in zip(encoder.layer, model.layers):
        set_encoder_layer(spec, layer)
    if cfg.norm == "pre":
        set_norm(encoder.layer_norm, model.final_norm)
    set_attention_options(encoder, None, cfg)
    head = model.cls_head or model.nsp_head
    spec = ts.TransformerEncoderModelSpec(encoder, pooling_layer=head is not None,
                                          pooling_activation=common.Activation.Tanh)
    if head is not None:
        set_linear(spec.pooler_dense, head.pooler)
    return spec


def vocabulary(tok, size: int, side: str) -> list[str]:
    """``size`` distinct strings, the tokenizer's piece for each id where it has a distinct one."""
    known = getattr(tok, "vocab_size", None) or (tok.tgt_vocab_size if side == "tgt" else tok.src_vocab_size) \
        if tok is not None else 0
    pieces = tok.pieces(range(min(known, size)), side) if known else []
    out: list[str] = []
    seen: set[str] = set()
    for i in range(size):
        piece = pieces[i] if i < len(pieces) and pieces[i] else f"<id_{i}>"
        piece = f"<id_{i}>" if piece in seen else piece
        seen.add(piece)
        out.append(piece)
    return out


def export_ct2_family(model_dir: str | os.PathLike, out: Path) -> dict[str, object]:
    """Write a CTranslate2 model for the decoder_only or encoder_only ``model_dir`` into ``out``; verify."""
    require("ctranslate2", "export")
    model, tok = load_for_export(model_dir, need_tokenizer=False)
    cfg = model.config
    lm = cfg.family.generates
    spec = decoder_lm_spec(model) if lm else encoder_model_spec(model)
    vocab = vocabulary(tok, getattr(cfg, cfg.family.vocab), cfg.family.side)
    spec.register_vocabulary(vocab)
    spec.config.unk_token = vocab[UNK_ID]
    if lm:
        spec.config.bos_token, spec.config.eos_token = vocab[cfg.bos_id], vocab[cfg.eos_id]
    spec.config.layer_norm_epsilon = cfg.layer_norm_eps
    try:
        spec.validate()
        spec.optimize(quantization="float32")
    except (ValueError, TypeError) as e:
        raise ExportError(f"CTranslate2 rejected the model spec: {e}") from None
    spec.save(str(out))
    if tok is not None:
        tok.save(out)
    if lm:
        return check_against(model, CT2Generator(out, cfg, vocab), default_probe(model), "CTranslate2")
    heads = "classification head is" if cfg.n_classes else \
        "masked-LM and next-sentence heads are" if cfg.nsp else "masked-LM head is"
    logger.warning("CTranslate2's Encoder returns the final states%s: the %s not in the export",
                   " and the pooled output" if (cfg.n_classes or cfg.nsp) else "", heads)
    reference = CT2Encoder(out, cfg, pooled=(model.cls_head or model.nsp_head) is not None)
    return check_against(model, reference, default_probe(model), "CTranslate2")


class CT2Generator(Reference):
    """The exported language model in ``ctranslate2.Generator``: logits (``forward_batch``), greedy
    continuations (``generate_batch``, never what ours never generates)."""

    def __init__(self, out: Path, cfg, vocab: list[str]):
        ctranslate2 = require("ctranslate2", "export")
        self.generator = ctranslate2.Generator(str(out), device="cpu", compute_type="float32", intra_threads=1)
        self.cfg, self.vocab = cfg, vocab

    def outputs(self, probe: Probe) -> dict[str, torch.Tensor]:
        return {"logits": torch.from_numpy(np.array(self.generator.forward_batch(probe.inputs[0].tolist())))}

    def generate(self, prompts: torch.Tensor, new: int) -> list[list[int]]:
        cfg, vocab = self.cfg, self.vocab
        results = self.generator.generate_batch(
            [[vocab[i] for i in row] for row in prompts.tolist()], max_length=new, min_length=0, sampling_topk=1,
            include_prompt_in_result=False, end_token=[cfg.eos_id],
            suppress_sequences=[[vocab[i]] for i in cfg.never_generated] or None)
        return [r.sequences_ids[0] for r in results]


class CT2Encoder(Reference):
    """The exported encoder in ``ctranslate2.Encoder``: final states at every unpadded position
    and, where the model has a pooler, the pooled output."""

    def __init__(self, out: Path, cfg, pooled: bool):
        ctranslate2 = require("ctranslate2", "export")
        self.encoder = ctranslate2.Encoder(str(out), device="cpu", compute_type="float32", intra_threads=1)
        self.types, self.pooled = cfg.type_vocab_size >= 2, pooled

    def outputs(self, probe: Probe) -> dict[str, torch.Tensor]:
        (ids, types), keep = probe.inputs, probe.keep
        rows = [row[k].tolist() for row, k in zip(ids, keep)]
        given = [row[k].tolist() for row, k in zip(types, keep)] if self.types else None
        result = self.encoder.forward_batch(rows, token_type_ids=given)
        named = {"states": torch.from_numpy(np.array(result.last_hidden_state))[:, : ids.shape[1]]}
        if self.pooled:
            named["pooled"] = torch.from_numpy(np.array(result.pooler_output))
        return named
