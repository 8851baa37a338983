"""The Table 3 plot of ``transduce ablate``: each row's validation perplexity and BLEU, the base
row's values as dashed lines."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .curves import require_matplotlib, save_figure


def plot_ablation(results: list[dict[str, Any]], out: Path) -> Path:
    """Two horizontal bar charts (PPL, BLEU) of the rows in ``results`` (base first) into ``out`` (PNG)."""
    plt = require_matplotlib("the ablation plot")
    names = [r["row"] for r in results]
    fig, axes = plt.subplots(1, 2, figsize=(10, 0.35 * len(names) + 1.5), sharey=True)
    for ax, key, label in zip(axes, ("val_ppl", "val_bleu"), ("PPL (dev)", "BLEU (dev)")):
        values = [r[key] if r[key] is not None else 0.0 for r in results]
        ax.barh(names, values, color=["tab:gray"] + ["tab:blue"] * (len(names) - 1))
        ax.axvline(values[0], color="black", linestyle="--", linewidth=1)
        ax.set_xlabel(label)
    axes[0].invert_yaxis()  # the base row on top, as the paper's table
    fig.suptitle("Table 3: model variations")
    try:
        return save_figure(fig, out)
    finally:
        plt.close(fig)
