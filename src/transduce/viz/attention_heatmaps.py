"""Attention heatmaps of one translation (:func:`~transduce.inference.analysis.attention_maps.attention_maps`),
and the health grid of every head over a file
(:func:`~transduce.inference.analysis.attention_stats.attention_stats`)."""

from __future__ import annotations

import os
from pathlib import Path

from ..atomic import atomic_path
from ..inference.analysis.attention_maps import AttentionMaps
from ..inference.analysis.attention_stats import KINDS, AttentionStats
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
    return _save(plt, fig, path, dpi)


def plot_attention_stats(stats: AttentionStats, path: str | os.PathLike, dpi: int = 120) -> Path:
    """Draw one grid per kind (encoder self-, decoder self-, cross-attention), a cell per head
    (rows layers, columns heads) coloured by its mean normalised entropy (1.0: uniform), with
    the entropy and the head's flags written in it ("U": uniform, "C:eos": collapsed onto EOS);
    write a PNG atomically."""
    plt = require_matplotlib("attention plots")
    n_heads = 1 + max(h.head for h in stats.heads)
    layers = {kind: 1 + max(h.layer for h in stats.heads if h.kind == kind) for kind in KINDS}
    fig, axes = plt.subplots(1, 3, figsize=(2.0 + 3 * (0.9 * n_heads + 0.6), 1.6 + 0.7 * max(layers.values())),
                             layout="constrained")
    for ax, kind in zip(axes, KINDS):
        grid = [[0.0] * n_heads for _ in range(layers[kind])]
        for h in (h for h in stats.heads if h.kind == kind):
            grid[h.layer][h.head] = h.entropy
            marks = " ".join("U" if f == "uniform" else "C:" + f.split(":", 1)[1] for f in h.flags)
            ax.text(h.head, h.layer, f"{h.entropy:.2f}" + (f"\n{marks}" if marks else ""), ha="center",
                    va="center", fontsize=7, color="white" if h.entropy < 0.6 else "black")
        image = ax.imshow(grid, cmap="viridis", vmin=0.0, vmax=1.0, aspect="equal")
        ax.set_title(f"{kind} attention", fontsize=9)
        ax.set_xticks(range(n_heads), [str(i) for i in range(n_heads)], fontsize=7)
        ax.set_yticks(range(layers[kind]), [str(i) for i in range(layers[kind])], fontsize=7)
        ax.set_xlabel("head", fontsize=8)
        ax.set_ylabel("layer", fontsize=8)
    fig.colorbar(image, ax=list(axes), shrink=0.8, label="normalised entropy (1 = uniform)")
    fig.suptitle(f"attention health over {stats.sentences} sentences")
    return _save(plt, fig, path, dpi)


def _save(plt, fig, path: str | os.PathLike, dpi: int) -> Path:
    """Write ``fig`` as a PNG at ``path`` atomically (its directory made), then close it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with atomic_path(path, ".png") as tmp:
            fig.savefig(tmp, format="png", dpi=dpi)
    finally:
        plt.close(fig)
    return path
