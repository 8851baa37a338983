"""Export an encoder_only model to a Hugging Face ``BertForMaskedLM`` (masked-LM head),
``BertForPreTraining`` (masked-LM and next-sentence heads, ``nsp``) or
``BertForSequenceClassification`` (``n_classes`` > 0) directory: config and safetensors.

BERT is our encoder_only model with these options: post-LN layers, learned positions, erf-GELU,
an embedding LayerNorm, no embedding scaling, biases everywhere. The weights then map one for
one; a model without token types (``type_vocab_size`` 0) is written with one all-zero type row,
which is what adding nothing is. Other options are refused with a one-line error naming them.

An imported model (BERT's WordPiece or RoBERTa's byte-level BPE tokenizer, its ids the original's
renumbered) is written in the original checkpoint's ids with the original's tokenizer files
(:mod:`~transduce.interop.hf_bert_vocab`), a model fine-tuned from one too; a RoBERTa as BERT
(its position table already starts at its first real position). Checked as a user reads it:
AutoTokenizer on the export gives our ids (in the export's numbering) on sample texts, and the
exported model's logits on them are ours. A SentencePiece tokenizer is not written: the directory
is then loaded with ``AutoModel*`` and fed our token ids (the [MASK] id is the last one).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import Tensor

from ..config import ModelConfig
from ..data.batch import pad
from ..data.hf_tokenizer import HFTokenizer
from ..errors import require
from ..model.encoder_only import EncoderOnly
from .base import ExportError, head_width_problems, load_for_export, no_progress_bars
from .hf_bert_vocab import export_order, original_tokenizer_files
from .hf_gpt2 import SAMPLE_TEXT, copy_tokenizer
from .hf_read import load_hf_model
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
# Longformer's projections for the global tokens' rows (``model.global_projections``).
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
    ``family="longformer"`` LongformerForMaskedLM. The export and the imports
    (:mod:`~transduce.interop.hf_bert_import`, :mod:`~transduce.interop.hf_longformer_import`) read
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


def bert_class(transformers, cfg: ModelConfig):
    if cfg.n_classes:
        return transformers.BertForSequenceClassification
    return transformers.BertForPreTraining if cfg.nsp else transformers.BertForMaskedLM


def export_hf_bert(model_dir: str | os.PathLike, out: Path) -> dict[str, object]:
    """Write a BertForMaskedLM / BertForPreTraining / BertForSequenceClassification directory for ``model_dir``
    into ``out`` and verify it: on probes, and on sample texts through its AutoTokenizer."""
    transformers = require("transformers", "export")
    model, tok = load_for_export(model_dir, need_tokenizer=False)
    cfg = model.config
    check_bert_compatible(cfg)
    order = export_order(tok, cfg.src_vocab_size)                        # (V,) the exported id of each of ours
    hf = bert_class(transformers, cfg)(bert_config(cfg, order))
    missing, unexpected = hf.load_state_dict(bert_state_dict(model, order), strict=False)
    if missing or unexpected:
        raise ExportError(f"BERT weight mapping is incomplete: missing {missing[:3]}, unexpected {unexpected[:3]}")
    with no_progress_bars(transformers):
        hf.save_pretrained(out)
        back = load_hf_model(bert_class(transformers, cfg), out)
        checks = verify_bert(model, back, order, "BERT")
        if isinstance(tok, HFTokenizer):  # an imported tokenizer: AutoTokenizer reads it beside the model
            write_hf_tokenizer(Path(model_dir), out, tok, order)
            checks.update(verify_bert_on_text(model, tok, back, out, order))
        return checks


def write_hf_tokenizer(model_dir: Path, out: Path, tok: HFTokenizer, order: Tensor) -> None:
    """The files AutoTokenizer reads: the original's (in its ids, ``order``) for an imported
    tokenizer; for one imported before its origin was kept, ours, read verbatim from
    ``tokenizer.json`` (``PreTrainedTokenizerFast``: BertTokenizer would rebuild the normaliser from
    defaults, lower-casing a cased WordPiece)."""
    if tok.origin is None:
        copy_tokenizer(model_dir, out, tok, "PreTrainedTokenizerFast")
        return
    for name, data in original_tokenizer_files(tok, order).items():
        (out / name).write_bytes(data)


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
def verify_bert(model: EncoderOnly, hf, order: Tensor, what: str, atol: float = 1e-4) -> dict[str, object]:
    """Our model against the transformers model ``hf`` (``order[i]``: its id of our id i) on padded
    probes with token types: the heads' logits within ``atol``. The import's check and the export's."""
    ids, types = probe_inputs(model.config)                              # (B, T) our ids
    keep = ids != model.config.pad_id                                    # (B, T)
    theirs = hf(input_ids=order[ids], attention_mask=keep.long(), token_type_ids=types)
    return compare_heads(model, model(ids, types), theirs, keep, order, what, atol)


@torch.no_grad()
def verify_bert_on_text(model: EncoderOnly, tok: HFTokenizer, hf, out: Path, order: Tensor,
                        atol: float = 1e-4) -> dict[str, object]:
    """What a user of ``out`` sees: AutoTokenizer on ``out`` reads sample texts into our ids with
    [CLS] / <s> first and [SEP] / </s> last (as ``order`` numbers them), and the model ``hf`` gives our
    logits on its encoding. ``tokenizer_differences`` (0, or an ExportError) and ``max_text_*``."""
    transformers = require("transformers", "export")
    cfg = model.config
    texts = [t for t in SAMPLE_TEXT if len(tok.encode(t)) + 2 <= cfg.max_positions]
    ids = pad([tok.encode(t) for t in texts], cfg.pad_id, bos=True, eos=True)  # (B, T) what classify feeds
    enc = transformers.AutoTokenizer.from_pretrained(out)(texts, padding=True, return_tensors="pt")
    bad = [t for t, want, got in zip(texts, order[ids].tolist(), enc["input_ids"].tolist()) if want != got]
    if bad:
        raise ExportError(f"verification failed: AutoTokenizer on {out} reads {bad[0]!r} into other ids than ours")
    states = model(ids, torch.zeros_like(ids) if cfg.type_vocab_size else None)
    checks = compare_heads(model, states, hf(**enc), ids != cfg.pad_id, order, "BERT (text through AutoTokenizer)",
                           atol)
    return {"tokenizer_differences": 0, **{k.replace("max_", "max_text_", 1): v for k, v in checks.items()}}


def compare_heads(model: EncoderOnly, states: Tensor, theirs, keep: Tensor, order: Tensor, what: str,
                  atol: float) -> dict[str, object]:
    """Our heads' logits on ``states`` (B, T, D) against transformers' output ``theirs``: the class
    logits, the masked-LM ones (in our id order, at the ``keep`` (B, T) positions), the next-sentence ones."""
    cfg = model.config
    if cfg.n_classes:
        return {"max_class_logit_diff": check_close(f"{what} class logits", model.classify(states), theirs.logits,
                                                    atol)}
    mlm = theirs.prediction_logits if cfg.nsp else theirs.logits         # (B, T, V) in the exported ids
    checks: dict[str, object] = {"max_logit_diff": check_close(
        f"{what} masked-LM logits", model.mlm_logits(states)[keep], mlm[..., order][keep], atol)}
    if cfg.nsp:
        checks["max_nsp_logit_diff"] = check_close(f"{what} next-sentence logits", model.next_sentence_logits(states),
                                                   theirs.seq_relationship_logits, atol)
    return checks
