"""A decoder-only language model (GPT: Radford et al., 2018/2019) from the Transformer's parts.

The Transformer's decoder without the encoder: embeddings and positions, ``n_decoder_layers``
causal self-attention + feed-forward blocks (:class:`DecoderLayer` without cross-attention), a
final LayerNorm for pre-LN, and the output projection (tied to the embedding by default). It
models p(x_t | x_<t) over one vocabulary (``tgt_vocab_size``); sequences start with BOS.

Parameter names are the encoder-decoder's decoder-side names (``tgt_embed``, ``decoder_layers``,
``decoder_norm``, ``output_proj``), so exports and checkpoints read alike.

Legend: B batch, T length, D d_model, V vocabulary.
"""

from __future__ import annotations

from torch import Tensor, nn

from ..config import ModelConfig
from .attention import KVCache
from .embeddings import RotaryEmbedding, TokenEmbedding
from .layers import DecoderLayer, init_linear_weights, norm_layer
from .transformer import DecoderOutput, Embedder


class DecoderOnlyLM(nn.Module):
    """A causal language model: ids (B, T) -> next-token logits (B, T, V).

    Args:
        cfg: a :class:`~transduce.config.ModelConfig` with ``arch="decoder_only"``; GPT-2's
            options are ``norm="pre"``, ``positions="learned"``, ``activation="gelu_tanh"``,
            ``scale_embeddings=False``, ``tie_output=True``.

    Examples:
        >>> from transduce.config import model_preset
        >>> lm = DecoderOnlyLM(model_preset("tiny", arch="decoder_only", src_vocab_size=100, tgt_vocab_size=100))
        >>> tuple(lm(torch.tensor([[1, 7, 8]])).shape)
        (1, 3, 100)
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        tokens = TokenEmbedding(cfg.tgt_vocab_size, cfg.d_model, cfg.embedding_pad_id, cfg.scale_embeddings)
        self.tgt_embed = Embedder(cfg, tokens)
        rope = RotaryEmbedding(cfg.d_head, cfg.rope_base) if cfg.positions == "rope" else None
        self.decoder_layers = nn.ModuleList(DecoderLayer(cfg, rope, cross_attention=False, layer=i)
                                            for i in range(cfg.n_decoder_layers))
        # Pre-LN leaves the residual stream unnormalised, so the stack ends with a LayerNorm.
        pre = cfg.norm == "pre"
        self.decoder_norm = norm_layer(cfg) if pre else None
        self.output_proj = nn.Linear(cfg.d_model, cfg.tgt_vocab_size, bias=False)
        init_linear_weights(self)
        if cfg.tie_output:  # the output projection shares the embedding matrix (GPT-2 as Sec. 3.4)
            self.output_proj.weight = tokens.weight

    def decode(self, ids: Tensor, cache: KVCache | None = None, need_weights: bool = False,
               project: bool = True) -> DecoderOutput:
        """Ids -> next-token logits.

        Without ``cache``: ``ids`` (B, T) is the whole sequence (teacher forcing). With ``cache``
        (start with :meth:`new_cache`): ``ids`` (B, t) holds only the new tokens; the cache is
        extended and returned. ``project=False`` leaves ``logits`` None (a fused loss applies
        ``output_proj`` itself).
        """
        start = cache.length if cache is not None else 0
        x = self.tgt_embed(ids, start)                                    # (B, T, D)
        self_ws = [] if need_weights else None
        for i, layer in enumerate(self.decoder_layers):
            x, w, _ = layer(x, None, None, cache.layers[i] if cache is not None else None, start, need_weights)
            if need_weights:
                self_ws.append(w)
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
        if cache is not None:
            cache.length += ids.shape[1]
        return DecoderOutput(x, self.output_proj(x) if project else None, cache, self_ws)

    def forward(self, ids: Tensor, project: bool = True) -> Tensor:
        """Ids (B, T) -> logits (B, T, V), or with ``project=False`` the final states (B, T, D)."""
        out = self.decode(ids, project=project)
        return out.logits if project else out.states

    def new_cache(self) -> KVCache:
        """An empty key/value cache for incremental decoding with :meth:`decode`."""
        return KVCache.empty(len(self.decoder_layers))

    def num_parameters(self) -> int:
        """Number of distinct trainable parameters (tied matrices counted once)."""
        return sum(p.numel() for p in self.parameters())
