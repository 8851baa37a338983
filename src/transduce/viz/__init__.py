"""Pictures: learning curves and attention maps (matplotlib, an optional extra)."""
