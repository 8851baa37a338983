"""Encoder and decoder layers (Sec. 3.1) and the position-wise feed-forward network (Sec. 3.3).

Each sub-layer is wrapped as LayerNorm(x + Dropout(Sublayer(x))) ("post", the paper) or
x + Dropout(Sublayer(LayerNorm(x))) ("pre", Xiong et al., 2020, https://arxiv.org/abs/2002.04745).
"""

from __future__ import annotations

from dataclasses import replace

import torch.nn.functional as F
from torch import Tensor, nn

from ..config import ModelConfig
from ..config.attention import AttentionConfig
from .attention import LayerCache, MultiHeadAttention
from .embeddings import RotaryEmbedding


GATED = ("swiglu", "geglu")


def norm_layer(cfg: ModelConfig) -> nn.Module:
    """The normalisation ``cfg.norm_kind`` names: LayerNorm, or RMSNorm (T5's, no bias)."""
    if cfg.norm_kind == "rms":
        return nn.RMSNorm(cfg.d_model, eps=cfg.layer_norm_eps)
    return nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps, bias=cfg.bias)


class FeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2 (Eq. 2); GELU (exact, or GPT-2's tanh approximation),
    SiLU (x * sigmoid(x), Marian's "swish"), SwiGLU or GEGLU by config.

    The gated FFNs (Shazeer, 2020, https://arxiv.org/abs/2002.05202): SwiGLU (Swish(x W1) * x Wg) W2,
    GEGLU (GELU_tanh(x W1) * x Wg) W2 (T5 1.1 and mT5's "gated-gelu").
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.activation = cfg.activation
        self.fc1 = nn.Linear(cfg.d_model, cfg.d_ff, bias=cfg.bias)
        self.fc_gate = nn.Linear(cfg.d_model, cfg.d_ff, bias=cfg.bias) if cfg.activation in GATED else None
        self.fc2 = nn.Linear(cfg.d_ff, cfg.d_model, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.activation_dropout)

    def forward(self, x: Tensor) -> Tensor:
        h = self.fc1(x)                                                   # (B, T, d_ff)
        if self.activation == "relu":
            h = F.relu(h)
        elif self.activation == "gelu":
            h = F.gelu(h)
        elif self.activation == "gelu_tanh":
            h = F.gelu(h, approximate="tanh")
        elif self.activation == "silu":
            h = F.silu(h)
        elif self.activation == "geglu":
            h = F.gelu(h, approximate="tanh") * self.fc_gate(x)
        else:
            h = F.silu(h) * self.fc_gate(x)
        return self.fc2(self.dropout(h) if self.training else h)  # (eval: no call of the identity)


def init_linear_weights(model: nn.Module, skip: tuple[nn.Module, ...] = ()) -> None:
    """Xavier-uniform linear weights, zero biases (as the reference tensor2tensor code); the
    layers in ``skip`` keep theirs (e.g. an output layer tied to an embedding)."""
    for module in model.modules():
        if isinstance(module, nn.Linear) and not any(module is m for m in skip):
            nn.init.xavier_uniform_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)


def attention_pattern(cfg: ModelConfig, kind: str, layer: int = 0) -> AttentionConfig:
    """One attention block's ``cfg.attention``: of kind ``kind`` (``cfg.attention.kind``, or
    ``.cross``, or full) in layer ``layer`` of the model: its window the layer's when
    ``windows`` gives one per layer, its random pattern's seed ``seed * 10000 + layer``; Longformer's
    projections for local self-attention only."""
    if kind == "full":
        return AttentionConfig()
    a = cfg.attention
    window = a.windows[layer] if a.windows and kind == "local" else a.window
    return replace(a, kind=kind, cross="full", window=window, windows=(), seed=a.seed * 10_000 + layer,
                   global_projections=a.global_projections and kind == "local")


def decoder_self_attention(cfg: ModelConfig) -> str:
    """The kind of the decoder's (causal) self-attention: local and lsh have a causal form;
    linformer and bigbird do not, so with them it stays full."""
    return cfg.attention.kind if cfg.attention.kind in ("local", "lsh") else "full"


def attention_block(cfg: ModelConfig, kind: str, rope: RotaryEmbedding | None = None,
                    layer: int = 0) -> MultiHeadAttention:
    """One attention block of ``cfg``'s width, heads (and their width), dropout, biases and scale,
    of pattern ``kind`` in layer ``layer`` (its random pattern's seed)."""
    return MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attention_dropout, cfg.bias, rope,
                              attention_pattern(cfg, kind, layer), None if cfg.scale_attention else 1.0,
                              cfg.d_head, cfg.max_positions)


class EncoderLayer(nn.Module):
    """Self-attention then feed-forward, each in a residual block."""

    def __init__(self, cfg: ModelConfig, rope: RotaryEmbedding | None = None, layer: int = 0):
        super().__init__()
        self.pre_norm = cfg.norm == "pre"
        self.self_attn = attention_block(cfg, cfg.attention.kind, rope, layer)
        self.ffn = FeedForward(cfg)
        self.norm1 = norm_layer(cfg)
        self.norm2 = norm_layer(cfg)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor, mask: Tensor | None, need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """x (B, S, D), mask (B, 1, 1, S), or additive (B, H, S, S) with a position bias
        -> (B, S, D), weights (B, H, S, S) or None."""
        h = self.norm1(x) if self.pre_norm else x
        h, weights = self.self_attn(h, h, mask, need_weights=need_weights)
        x = self._residual(x, h, self.norm1)
        h = self.ffn(self.norm2(x) if self.pre_norm else x)
        return self._residual(x, h, self.norm2), weights

    def _residual(self, x: Tensor, h: Tensor, norm: nn.Module) -> Tensor:
        # (in eval mode dropout is the identity: skipping its call saves a step of decoding time)
        x = x + (self.dropout(h) if self.training else h)
        return x if self.pre_norm else norm(x)


class DecoderLayer(nn.Module):
    """Masked self-attention, encoder-decoder attention, feed-forward (Sec. 3.1, "Decoder").

    ``cross_attention=False`` leaves the middle block out (no ``cross_attn``, no ``norm2``): the
    layer of a decoder-only language model, whose only context is the prefix (GPT).
    Self-attention is local or lsh when ``cfg.attention.kind`` is (causal), else full
    (:func:`decoder_self_attention`): Linformer's projection and BigBird's global and random
    blocks mix future positions, so they have no causal form. ``layer`` is the layer's index
    in the model (its random pattern's seed).
    """

    def __init__(self, cfg: ModelConfig, rope: RotaryEmbedding | None = None, cross_attention: bool = True,
                 layer: int = 0):
        super().__init__()
        self.pre_norm = cfg.norm == "pre"
        self.self_attn = attention_block(cfg, decoder_self_attention(cfg), rope, layer)
        self.cross_attn = attention_block(cfg, cfg.attention.cross) if cross_attention else None
        self.ffn = FeedForward(cfg)
        self.norm1 = norm_layer(cfg)
        self.norm2 = norm_layer(cfg) if cross_attention else None
        self.norm3 = norm_layer(cfg)
        self.dropout = nn.Dropout(cfg.dropout)

    _residual = EncoderLayer._residual

    def forward(
        self, x: Tensor, memory: Tensor | None, memory_mask: Tensor | None, cache: LayerCache | None = None,
        start: int = 0, need_weights: bool = False, self_mask: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """Decode x (B, T, D) against memory (B, S, D) (None for a layer without cross-attention).

        Without a cache the layer sees the whole target prefix under a causal mask. With a cache,
        x holds only the new positions start..start+T-1 and the cache is updated in place.
        ``self_mask``: an additive self-attention mask (1, H, T, Tk) holding a position bias and
        the causal -inf (T5), used instead of the causal mask and the cache's key mask.

        Returns: (B, T, D), self-attention weights (B, H, T, start+T) and cross-attention
        weights (B, H, T, S), the weights only if ``need_weights`` (and cross-attention exists).
        """
        h = self.norm1(x) if self.pre_norm else x
        h, self_w = self._self_attention(h, cache, start, need_weights, self_mask)
        x = self._residual(x, h, self.norm1)
        cross_w = None
        if self.cross_attn is not None:
            x, cross_w = self._cross_attention(x, memory, memory_mask, cache, start, need_weights)
        h = self.ffn(self.norm3(x) if self.pre_norm else x)
        return self._residual(x, h, self.norm3), self_w, cross_w

    def _cross_attention(self, x: Tensor, memory: Tensor, memory_mask: Tensor | None, cache: LayerCache | None,
                         start: int, need_weights: bool) -> tuple[Tensor, Tensor | None]:
        h = self.norm2(x) if self.pre_norm else x
        kv = None
        if cache is not None:
            if cache.cross_k is None:  # first step: project the encoder output once
                cache.cross_k, cache.cross_v = self.cross_attn.project_kv(memory)
            kv = (cache.cross_k, cache.cross_v)
        h, cross_w = self.cross_attn(h, memory, memory_mask, kv=kv, start=start, need_weights=need_weights)
        return self._residual(x, h, self.norm2), cross_w

    def _self_attention(self, h: Tensor, cache: LayerCache | None, start: int, need_weights: bool,
                        self_mask: Tensor | None):
        if cache is None:
            # Right-padded targets need no padding mask here: the causal mask already keeps
            # real positions from seeing the pads after them, and pad positions are not scored.
            return self.self_attn(h, h, self_mask, is_causal=self_mask is None, need_weights=need_weights)
        q, k, v = self.self_attn.project_qkv(h, start)
        # The cache keeps every position; local attention slices the last W (+ global) out of it.
        k, v = cache.append(k, v)                                         # (B, H, start+T, Dh)
        if self_mask is not None:  # (it hides the keys after each query, the cache's room included)
            return self.self_attn.attend(q, k, v, self_mask, need_weights=need_weights, start=start)
        causal = h.shape[1] > 1  # a single new position may see the whole cache
        return self.self_attn.attend(q, k, v, cache.key_mask, is_causal=causal, need_weights=need_weights, start=start)
