"""transduce: the Transformer of "Attention Is All You Need", from raw text to a served model."""

__version__ = "0.1.0"
