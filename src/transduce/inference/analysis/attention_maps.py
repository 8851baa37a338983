"""Attention maps of one translation: encoder self-, decoder self- and cross-attention.

The sentence is translated first, then the model is re-run once with teacher forcing on the
best hypothesis with ``need_weights=True`` (explicit softmax path), which gives all three maps
of a layer at once. :func:`transduce.viz.attention_heatmaps.plot_attention` draws them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ...config import DecodeConfig
from ...errors import TransduceError
from ..translator import Translator, check_layer_head


@dataclass
class AttentionMaps:
    """Attention of one layer (one head, or the mean over heads).

    Attributes:
        source_pieces: source subwords + "</s>" (S).
        target_pieces: decoder inputs, "<s>" + output subwords (T).
        output_pieces: what each decoder position predicts, output subwords + "</s>" (T).
        encoder: (S, S) encoder self-attention, rows attend over columns.
        decoder: (T, T) masked decoder self-attention.
        cross: (T, S) encoder-decoder attention.
    """

    source_pieces: list[str]
    target_pieces: list[str]
    output_pieces: list[str]
    encoder: Tensor
    decoder: Tensor
    cross: Tensor
    layer: int
    head: int | None


def _select(weights: list[Tensor], layer: int, head: int | None) -> Tensor:
    """Layer ``layer``'s (1, H, Tq, Tk) map -> (Tq, Tk): one head or the mean of heads."""
    w = weights[layer][0].float()                                        # (H, Tq, Tk)
    return (w.mean(dim=0) if head is None else w[head]).cpu()


def attention_maps(translator: Translator, text: str, layer: int = -1, head: int | None = None,
                   decode: DecodeConfig | None = None, **overrides) -> AttentionMaps:
    """Translate ``text`` (with ``decode``, default the translator's settings, and ``overrides``
    of its fields) and return the attention maps of ``layer`` (encoder, decoder and cross
    attention of that layer index)."""
    model, cfg = translator.model, translator.model.config
    check_layer_head(cfg, layer, head, "layer")
    result = translator.translate_detailed([text], decode, **overrides)[0]
    if not result.source_tokens:
        raise TransduceError("attention: the sentence is empty")
    best = result.best
    src = torch.tensor([result.source_tokens + [cfg.eos_id]], device=translator.device)  # (1, S)
    tgt = torch.tensor([[cfg.bos_id] + best.tokens], device=translator.device)        # (1, T)
    with torch.inference_mode(), translator.autocast():
        enc = model.encode(src, need_weights=True)
        dec = model.decode(tgt, enc, need_weights=True)
    return AttentionMaps(
        result.source_pieces + ["</s>"], ["<s>"] + best.pieces,
        best.pieces + (["</s>"] if best.ended else ["…"]),
        _select(enc.attentions, layer, head), _select(dec.self_attentions, layer, head),
        _select(dec.cross_attentions, layer, head), layer, head,
    )
