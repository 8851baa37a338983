"""Learning curves of a run (loss, validation BLEU, learning rate) from ``metrics.jsonl``."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..atomic import atomic_path
from ..errors import TransduceError, require


def require_matplotlib(what: str = "plotting"):
    """Import matplotlib with a headless backend, or explain how to get it."""
    matplotlib = require("matplotlib", "plot", what)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def read_metrics(run_dir: str | os.PathLike) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise TransduceError(f"{path}: not found (is {run_dir} a training run directory?)")
    records = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                raise TransduceError(f"{path}:{n}: not valid JSON") from None
    return records


def save_figure(fig, out: Path) -> Path:
    """Save a matplotlib figure as PNG atomically."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out, ".png") as tmp:
        fig.savefig(tmp, dpi=110, bbox_inches="tight")
    return out


def plot_run(run_dir: str | os.PathLike, out: str | os.PathLike | None = None) -> Path:
    """Three panels against the step: train/val loss, val BLEU, learning rate. Returns the PNG path."""
    plt = require_matplotlib()
    records = read_metrics(run_dir)
    train = [r for r in records if "loss" in r]
    val = [r for r in records if "val_loss" in r or "val_bleu" in r]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    axes[0].plot([r["step"] for r in train], [r["loss"] for r in train], label="train (smoothed)")
    vl = [r for r in val if "val_loss" in r]
    axes[0].plot([r["step"] for r in vl], [r["val_loss"] for r in vl], "o-", label="validation")
    axes[0].set(title="loss per token", xlabel="step")
    axes[0].legend()
    vb = [r for r in val if "val_bleu" in r]
    axes[1].plot([r["step"] for r in vb], [r["val_bleu"] for r in vb], "o-", color="C2")
    axes[1].set(title="validation BLEU (greedy)", xlabel="step")
    axes[2].plot([r["step"] for r in train], [r["lr"] for r in train], color="C3")
    axes[2].set(title="learning rate", xlabel="step")
    for ax in axes:
        ax.grid(alpha=0.3)
    path = save_figure(fig, Path(out) if out else Path(run_dir) / "curves.png")
    plt.close(fig)
    return path
