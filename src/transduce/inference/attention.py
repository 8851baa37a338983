"""Attention heatmaps of one translation: encoder self-, decoder self- and cross-attention.

The sentence is translated first, then the model is re-run once with teacher forcing on the
best hypothesis with ``need_weights=True`` (explicit softmax path), which gives all three maps
of a layer at once. matplotlib is imported only inside :func:`plot_attention`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from ..atomic import atomic_path
from ..errors import ConfigError, TransduceError
from .translator import Translator


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
                   beam: int = 4, lenpen: float = 0.6) -> AttentionMaps:
    """Translate ``text`` and return the attention maps of ``layer`` (all layers' encoder,
    decoder and cross attention come from the same layer index)."""
    model, cfg = translator.model, translator.model.config
    for name, n in (("encoder", cfg.n_encoder_layers), ("decoder", cfg.n_decoder_layers)):
        if not -n <= layer < n:
            raise ConfigError(f"--layer: must be in [{-n}, {n}) for the {n}-layer {name}; got {layer}")
    if head is not None and not 0 <= head < cfg.n_heads:
        raise ConfigError(f"--head: must be in [0, {cfg.n_heads}); got {head}")
    result = translator.translate_detailed([text], beam=beam, lenpen=lenpen)[0]
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


def plot_attention(maps: AttentionMaps, path: str | os.PathLike, dpi: int = 120) -> Path:
    """Draw the three heatmaps side by side with subwords on the axes; write a PNG atomically."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise TransduceError("attention plots need matplotlib: pip install 'transduce[plot]'") from None
    panels = [("encoder self-attention", maps.encoder, maps.source_pieces, maps.source_pieces),
              ("decoder self-attention", maps.decoder, maps.target_pieces, maps.target_pieces),
              ("cross-attention", maps.cross, maps.output_pieces, maps.source_pieces)]
    cell = 0.28  # inches per token, shrunk so that very long outputs still fit one image
    widths = [len(cols) for _, _, _, cols in panels]
    rows = max(len(r) for _, _, r, _ in panels)
    scale = min(1.0, 40.0 / (cell * sum(widths)), 40.0 / (cell * rows))
    fig, axes = plt.subplots(1, 3, figsize=(2.0 + cell * scale * sum(widths), 2.0 + cell * scale * rows),
                             gridspec_kw={"width_ratios": widths}, layout="constrained")
    for ax, (title, w, row_labels, col_labels) in zip(axes, panels):
        ax.imshow(w.numpy(), cmap="viridis", vmin=0.0, vmax=1.0, aspect="equal")
        ax.set_title(title, fontsize=9)
        ax.set_xticks(range(len(col_labels)), col_labels, rotation=90, fontsize=7)
        ax.set_yticks(range(len(row_labels)), row_labels, fontsize=7)
    head = "mean of heads" if maps.head is None else f"head {maps.head}"
    fig.suptitle(f"layer {maps.layer}, {head}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with atomic_path(path, ".png") as tmp:
            fig.savefig(tmp, format="png", dpi=dpi)
    finally:
        plt.close(fig)
    return path
