"""Pictures: learning curves, the ablation plot and attention heatmaps (matplotlib, an optional extra)."""
