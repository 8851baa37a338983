"""Import a Hugging Face Longformer directory (``LongformerForMaskedLM`` or ``LongformerModel``:
config.json, weights, tokenizer.json with tokenizer_config.json or special_tokens_map.json) as a
transduce encoder_only model with local attention and its tokenizer, verified against
transformers before anything is written.

Longformer (Beltagy et al., 2020, https://arxiv.org/abs/2004.05150) is RoBERTa (the same
embeddings, position offset, layers, masked-LM head and byte-level BPE, all mapped as
:mod:`~transduce.interop.bert` maps RoBERTa's) with another self-attention, which maps
onto our ``model.attention.kind=local`` exactly:

- **the window**: a token sees the tokens within ``attention_window / 2`` on each side
  (``LongformerSelfAttention.one_sided_attn_window_size``), ours ``model.attention.window``; a
  list of windows, one per layer, is ``model.attention.windows``;
- **global tokens**: transformers marks them per call (``global_attention_mask``); ours are the
  first ``model.attention.global_tokens`` positions, i.e. ``global_attention_mask[:, :G] = 1``. The model
  is written with G = 0, what ``LongformerForMaskedLM`` runs without a ``global_attention_mask``
  (and how Longformer was pretrained); set ``model.attention.global_tokens`` (1: ``<s>``, as
  ``LongformerForSequenceClassification`` does) to fine-tune with global attention;
- **their projections**: a global token's row is computed from ``query_global``, ``key_global``
  and ``value_global`` over every position, while the other rows see the global tokens through
  the local ``key`` and ``value``, each key once: ``model.attention.global_projections``
  (:meth:`~transduce.model.attention.MultiHeadAttention.with_global_rows`);
- transformers pads a batch to a multiple of the window with masked pad tokens and cuts the
  output back: nothing a real token sees.

``LongformerModel`` has no head: its encoder is imported exactly (final states checked) and the
masked-LM head is newly initialised (tied to the token embedding), ready for
``train.init_from``; its pooler is not kept.

Not supported (one-line errors): an odd or non-positive ``attention_window``, a list of the
wrong length, and what the RoBERTa import refuses.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import torch
from torch import Tensor

from ..config import AttentionConfig, ModelConfig
from ..model import EncoderOnly
from .bert import IMPORT as BERT_IMPORT, EncoderCheckpoint, bert_model_config, bert_names, our_bert_state, \
    read_checkpoint
from .hf import HFEncoder, HFImportError
from .verify import check_against, encoder_probe, probe_inputs

logger = logging.getLogger(__name__)

ARCHITECTURES = ("LongformerForMaskedLM", "LongformerModel")
GLOBALS_CHECKED = (0, 2)  # global tokens in the verification: none (transformers' default), and two


def longformer_architecture(config: dict, where: Path) -> str:
    """The importable architecture a Longformer config.json names; a one-line error otherwise."""
    names = config.get("architectures") or ["LongformerModel"]
    if names[0] not in ARCHITECTURES:
        raise HFImportError(f"{where / 'config.json'}: architectures={names} is not importable for "
                            f"model_type=longformer (supported: {', '.join(ARCHITECTURES)})")
    return names[0]


def local_windows(config: dict, where: Path) -> tuple[int, ...]:
    """Each layer's one-sided window: config.json's ``attention_window`` (an int, or one per layer)
    halved, as LongformerSelfAttention does."""
    name, layers = where / "config.json", config.get("num_hidden_layers")
    windows = config.get("attention_window", 512)
    windows = [windows] * int(layers or 0) if isinstance(windows, int) else windows
    if not isinstance(windows, list) or len(windows) != layers:
        raise HFImportError(f"{name}: attention_window={config.get('attention_window')!r} is not an int or a list "
                            f"of one per layer (num_hidden_layers={layers})")
    if not all(isinstance(w, int) and w > 0 and w % 2 == 0 for w in windows):
        raise HFImportError(f"{name}: attention_window={windows} must be positive even integers (the window "
                            "spans w/2 tokens each side)")
    return tuple(w // 2 for w in windows)


def longformer_checkpoint(where: Path, config: dict) -> EncoderCheckpoint:
    """The :class:`~.bert.EncoderCheckpoint` of a Longformer directory (RoBERTa's heads)."""
    return read_checkpoint(where, config, longformer_architecture(config, where), "longformer", "mlm")


def longformer_model_config(config: dict, where: Path, state: dict[str, Tensor], ckpt: EncoderCheckpoint
                            ) -> ModelConfig:
    """Our ModelConfig for a LongformerConfig (as a dict): RoBERTa's, with local attention,
    global projections and the windows (a LongformerModel's new head tied)."""
    cfg = bert_model_config(config, where, state, ckpt, True if ckpt.arch == "LongformerModel" else None)
    windows = local_windows(config, where)
    same = len(set(windows)) == 1
    return replace(cfg, attention=AttentionConfig("local", window=windows[0], windows=() if same else windows,
                                                  global_tokens=0, global_projections=True))


def our_longformer_state(state: dict[str, Tensor], cfg: ModelConfig, ckpt: EncoderCheckpoint, where: Path
                         ) -> dict[str, Tensor]:
    """RoBERTa's mapping (:func:`~.bert.our_bert_state`); a LongformerModel's weights with a new
    masked-LM head (a freshly initialised model's, under transformers' names)."""
    if ckpt.arch == "LongformerModel":
        state = {k if k.startswith("longformer.") else f"longformer.{k}": v for k, v in state.items()}
        fresh = EncoderOnly(cfg).state_dict()
        for ours, theirs in bert_names(cfg, "longformer").items():
            if ours.startswith("mlm_head.") and not (cfg.tie_output and ours == "mlm_head.decoder.weight"):
                state[theirs] = fresh[ours]
        logger.warning("%s: LongformerModel has no head; the masked-LM head is new (train it)", where)
    return our_bert_state(state, cfg, ckpt, where)


def probe_lengths(cfg: ModelConfig) -> tuple[int, ...]:
    """Probe lengths that reach past the widest window on both sides of a token (and short ones)."""
    widest = max(cfg.attention.windows or (cfg.attention.window,))
    top = 2 * widest + 5
    return (top, top - 3, top // 2 + 1, 3, 1)


def verify_longformer(model: EncoderOnly, hf, ckpt: EncoderCheckpoint) -> dict[str, object]:
    """The imported model against the transformers model on padded probes longer than the
    windows (no token types), with no global tokens and with the first two global
    (``global_attention_mask``): the masked-LM logits (in our id order), or a LongformerModel's
    final states, at the non-pad positions."""
    ids, _ = probe_inputs(model.config, lengths=probe_lengths(model.config))  # (B, T) our ids
    checks: dict[str, object] = {}
    for g in GLOBALS_CHECKED:
        ours = model
        if g != model.config.attention.global_tokens:
            ours = EncoderOnly(replace(model.config, attention=replace(model.config.attention, global_tokens=g))).eval()
            ours.load_state_dict(model.state_dict())
        marks = torch.zeros_like(ids)
        marks[:, :g] = 1
        reference = HFEncoder(hf, model.config, ckpt.order, global_attention_mask=marks)
        found = check_against(ours, reference, encoder_probe(ids, None, model.config.pad_id),
                              f"imported ({g} global tokens)")
        checks.update({f"{k}_global_{g}": v for k, v in found.items()})
    return checks


IMPORT = replace(BERT_IMPORT, vocabulary=longformer_checkpoint, model_config=longformer_model_config,
                 our_state=our_longformer_state, verify=verify_longformer)
