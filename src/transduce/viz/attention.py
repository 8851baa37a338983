"""Attention heatmaps of one translation (:func:`~transduce.inference.attention.attention_maps`)."""

from __future__ import annotations

import os
from pathlib import Path

from ..atomic import atomic_path
from ..inference.attention import AttentionMaps
from .curves import require_matplotlib


def plot_attention(maps: AttentionMaps, path: str | os.PathLike, dpi: int = 120) -> Path:
    """Draw the three heatmaps side by side with subwords on the axes; write a PNG atomically."""
    plt = require_matplotlib("attention plots")
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
