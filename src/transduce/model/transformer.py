"""The encoder-decoder Transformer (Sec. 3, Figure 1).

``encode`` maps source ids to memory, ``decode`` maps target ids (all at once, or a few new
ones with a :class:`KVCache`) and memory to logits, ``forward`` does both. The model returns
logits; losses live in :mod:`transduce.training`.

Legend: B batch, S source length, T target length, D d_model, H heads, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..config import ModelConfig
from ..errors import ConfigError
from .attention import KVCache, MultiHeadAttention
from .embeddings import (LearnedPositions, RelativePositionBias, RotaryEmbedding, SinusoidalPositions, TokenEmbedding,
                         TokenTypeEmbedding)
from .layers import DecoderLayer, EncoderLayer, init_linear_weights, norm_layer
from .masks import padding_mask, with_bias


@dataclass
class EncoderOutput:
    """Encoder output: memory (B, S, D), its key mask (B, 1, 1, S), optional attention maps."""

    memory: Tensor
    mask: Tensor
    attentions: list[Tensor] | None = None

    def index_select(self, index: Tensor) -> "EncoderOutput":
        """Rows of the batch, e.g. ``arange(B).repeat_interleave(beam)`` to expand for beams."""
        return EncoderOutput(self.memory.index_select(0, index), self.mask.index_select(0, index))


@dataclass
class DecoderOutput:
    """The decoder's output states (B, T, D), their logits (B, T, V) (None when decoded with
    ``project=False``), the updated cache (if one was given), and optional attention maps per
    layer: self (B, H, T, T_total) and cross (B, H, T, S)."""

    states: Tensor
    logits: Tensor | None = None
    cache: KVCache | None = None
    self_attentions: list[Tensor] | None = None
    cross_attentions: list[Tensor] | None = None


class Embedder(nn.Module):
    """Token embedding * sqrt(D) + positions, then dropout (Sec. 3.4, 3.5, 5.4).

    BERT's options (encoder_only configs): + token-type embeddings (``type_vocab_size`` > 0),
    and a LayerNorm of the sum before the dropout (``embed_norm``; also mBART's, each stack its own).
    """

    def __init__(self, cfg: ModelConfig, tokens: TokenEmbedding):
        super().__init__()
        self.tokens = tokens
        if cfg.positions in ("sinusoidal", "fairseq"):
            self.positions = SinusoidalPositions(cfg.d_model, cfg.max_positions, cfg.positions)
        elif cfg.positions == "learned":
            self.positions = LearnedPositions(cfg.d_model, cfg.max_positions)
        else:  # rope, relative: positions enter inside attention
            self.positions = None
        self.token_types = TokenTypeEmbedding(cfg.type_vocab_size, cfg.d_model) if cfg.type_vocab_size else None
        self.norm = norm_layer(cfg) if cfg.embed_norm else None
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, ids: Tensor, start: int | Tensor = 0, token_types: Tensor | None = None) -> Tensor:
        """ids (B, T) at positions start.. -> (B, T, D); ``token_types`` (B, T) ids, type 0 everywhere if None."""
        x = self.tokens(ids)                                              # (B, T, D)
        if self.positions is not None:
            x = x + self.positions(start, ids.shape[1]).to(x.dtype)
        if self.token_types is not None:
            x = x + self.token_types(token_types).to(x.dtype)
        elif token_types is not None:
            raise ValueError("token_types given to a model without them (model.type_vocab_size=0)")
        if self.norm is not None:
            x = self.norm(x)
        return self.dropout(x) if self.training else x


class Transformer(nn.Module):
    """The Transformer of Vaswani et al. (2017), https://arxiv.org/abs/1706.03762.

    Args:
        cfg: the model configuration (see :class:`~transduce.config.ModelConfig`).

    Examples:
        >>> from transduce.config import model_preset
        >>> model = Transformer(model_preset("tiny", src_vocab_size=100, tgt_vocab_size=100))
        >>> logits = model(torch.tensor([[5, 6, 2]]), torch.tensor([[1, 7]]))
        >>> tuple(logits.shape)
        (1, 2, 100)
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.arch == "encoder_only":  # a config for EncoderOnly must not quietly build a translation model
            raise ConfigError("model.arch: encoder_only models are built by build_model (EncoderOnly), not Transformer")
        self.config = cfg
        # Without the sqrt(D) scale (T5) the embeddings start at unit variance, as T5's do: at
        # D^-0.5 the first layers' outputs would drown the tokens in the residual stream.
        std = None if cfg.scale_embeddings else 1.0
        src_tokens = TokenEmbedding(cfg.src_vocab_size, cfg.d_model, cfg.embedding_pad_id, cfg.scale_embeddings, std)
        tgt_tokens = src_tokens if cfg.share_embeddings else TokenEmbedding(
            cfg.tgt_vocab_size, cfg.d_model, cfg.embedding_pad_id, cfg.scale_embeddings, std)
        self.src_embed = Embedder(cfg, src_tokens)
        self.tgt_embed = Embedder(cfg, tgt_tokens)
        rope = RotaryEmbedding(cfg.d_head, cfg.rope_base) if cfg.positions == "rope" else None
        self.encoder_layers = nn.ModuleList(EncoderLayer(cfg, rope, i) for i in range(cfg.n_encoder_layers))
        self.decoder_layers = nn.ModuleList(DecoderLayer(cfg, rope, layer=cfg.n_encoder_layers + i)
                                            for i in range(cfg.n_decoder_layers))
        # Pre-LN leaves the residual stream unnormalised, so each stack ends with a LayerNorm.
        pre = cfg.norm == "pre"
        self.encoder_norm = norm_layer(cfg) if pre else None
        self.decoder_norm = norm_layer(cfg) if pre else None
        self.encoder_bias, self.decoder_bias = (
            (RelativePositionBias(cfg.n_heads, cfg.relative_buckets, cfg.relative_max_distance, bidirectional)
             for bidirectional in (True, False)) if cfg.positions == "relative" else (None, None))
        self.output_proj = nn.Linear(cfg.d_model, cfg.tgt_vocab_size, bias=cfg.output_bias)
        self.output_scale = cfg.d_model ** -0.5 if cfg.scale_output else 1.0
        init_linear_weights(self)
        if not cfg.scale_attention:  # T5 folds 1/sqrt(Dh) into the queries' initialisation
            with torch.no_grad():
                for m in self.modules():
                    if isinstance(m, MultiHeadAttention):
                        m.q_proj.weight.mul_(cfg.d_head ** -0.5)
        if cfg.tie_output:  # Sec. 3.4: the pre-softmax projection shares the embedding matrix
            self.output_proj.weight = tgt_tokens.weight

    def encode(self, src: Tensor, need_weights: bool = False) -> EncoderOutput:
        """Source ids (B, S) -> memory (B, S, D). Pad positions are masked as keys."""
        mask = padding_mask(src, self.config.pad_id)                     # (B, 1, 1, S)
        self_mask = mask
        if self.encoder_bias is not None:  # T5: one bias for every layer, with the pads' -inf
            pos = torch.arange(src.shape[1], device=src.device)
            self_mask = with_bias(self.encoder_bias(pos, pos), mask)       # (B, H, S, S)
        x = self.src_embed(src)
        attentions = [] if need_weights else None
        for layer in self.encoder_layers:
            x, w = layer(x, self_mask, need_weights)
            if need_weights:
                attentions.append(w)
        if self.encoder_norm is not None:
            x = self.encoder_norm(x)
        return EncoderOutput(x, mask, attentions)

    def decode(self, tgt: Tensor, enc: EncoderOutput, cache: KVCache | None = None,
               need_weights: bool = False, project: bool = True, weights_layer: int | None = None) -> DecoderOutput:
        """Target ids -> next-token logits.

        Without ``cache``: ``tgt`` (B, T) is the whole shifted target (teacher forcing).
        With ``cache`` (start with ``model.new_cache()``): ``tgt`` (B, t) holds only the new
        tokens; the cache is extended and returned, so each step costs the same. The new tokens
        start at ``cache.length``: an int, or a 0-dim tensor advanced in place (a cache of
        preallocated buffers, whose step a CUDA graph can replay).
        ``project=False`` leaves ``logits`` None, for a loss or search that applies
        ``output_proj`` to the ``states`` itself. ``weights_layer`` (negative from the top): the
        attention maps of that layer alone, as lists of one (guided alignment training).
        """
        start = cache.length if cache is not None else 0
        x = self.tgt_embed(tgt, start)                                    # (B, T, D)
        self_mask = self._decoder_self_mask(tgt.shape[1], cache, start, tgt.device)
        self_ws, cross_ws = ([], []) if need_weights or weights_layer is not None else (None, None)
        only = None if weights_layer is None else weights_layer % len(self.decoder_layers)
        for i, layer in enumerate(self.decoder_layers):
            layer_cache = cache.layers[i] if cache is not None else None
            keep = need_weights or i == only
            x, sw, cw = layer(x, enc.memory, enc.mask, layer_cache, start, keep, self_mask)
            if keep:
                self_ws.append(sw)
                cross_ws.append(cw)
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
        if self.output_scale != 1.0:  # T5's rescale before the tied projection
            x = x * self.output_scale
        if cache is not None:
            cache.length += tgt.shape[1]
        return DecoderOutput(x, self.output_proj(x) if project else None, cache, self_ws, cross_ws)

    def _decoder_self_mask(self, t: int, cache: KVCache | None, start: int | Tensor,
                           device: torch.device) -> Tensor | None:
        """T5's causal relative bias for queries start..start+T-1 over every key the layers will
        see (the cache's, its room included), -inf after each query -> (1, H, T, Tk); None
        without relative positions."""
        if self.decoder_bias is None:
            return None
        q_pos = torch.arange(t, device=device) + start                   # (T,)
        k_pos = torch.arange(t if cache is None else cache.key_length(t), device=device)
        return with_bias(self.decoder_bias(q_pos, k_pos), k_pos[None, :] <= q_pos[:, None])

    def forward(self, src: Tensor, tgt: Tensor, project: bool = True,
                weights_layer: int | None = None) -> Tensor | tuple[Tensor, Tensor]:
        """Source (B, S) and shifted target (B, T) ids -> logits (B, T, V), or with
        ``project=False`` the states before the output projection (B, T, D); with
        ``weights_layer``, also that decoder layer's cross-attention weights (B, H, T, S)."""
        out = self.decode(tgt, self.encode(src), project=project, weights_layer=weights_layer)
        result = out.logits if project else out.states
        return result if weights_layer is None else (result, out.cross_attentions[0])

    def new_cache(self) -> KVCache:
        """An empty key/value cache for incremental decoding with :meth:`decode`."""
        return KVCache.empty(len(self.decoder_layers))

    def num_parameters(self) -> int:
        """Number of distinct trainable parameters (tied matrices counted once)."""
        return sum(p.numel() for p in self.parameters())
