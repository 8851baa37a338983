"""transduce: the Transformer of "Attention Is All You Need", from raw text to a served model."""

__version__ = "0.2.0"


def __getattr__(name: str):
    """``transduce.import_hf`` (a Hugging Face Marian or T5 directory -> a transduce model), imported lazily."""
    if name == "import_hf":
        from .interop import import_hf  # lazy: start-up
        return import_hf
    raise AttributeError(f"module 'transduce' has no attribute {name!r}")
