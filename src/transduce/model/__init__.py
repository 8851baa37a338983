"""The Transformer model: masks, attention with a KV cache, embeddings, layers, the model (and
the decoder-only language model built from the same parts)."""

from .attention import KVCache, LayerCache, MultiHeadAttention, full_attention_only, scaled_dot_product_attention
from .encoder_only import EncoderOnly
from .io import build_model, load_model, save_model
from .lm import DecoderOnlyLM
from .masks import causal_mask, padding_mask
from .transformer import DecoderOutput, EncoderOutput, Transformer

__all__ = [
    "KVCache", "LayerCache", "MultiHeadAttention", "full_attention_only", "scaled_dot_product_attention",
    "causal_mask", "padding_mask", "Transformer", "EncoderOutput", "DecoderOutput",
    "save_model", "load_model", "build_model", "DecoderOnlyLM", "EncoderOnly",
]
