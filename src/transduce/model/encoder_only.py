"""An encoder-only Transformer, as BERT (Devlin et al., 2019, https://arxiv.org/abs/1810.04805).

The paper's encoder stack (Sec. 3.1) on its own: embeddings (tokens, positions, optionally
token types and a LayerNorm), N :class:`~transduce.model.layers.EncoderLayer` seeing the whole
sequence (only padding is masked), and one head:

- ``n_classes == 0``: the masked-LM head, BERT's transform (dense, GELU, LayerNorm) then the
  decoder to the vocabulary, tied to the token embedding (``tie_output``) with a bias of its own;
- ``n_classes > 0``: the classification head, BERT's pooler tanh(dense(h[CLS])) then a linear
  layer to the classes. The first position plays [CLS]: inputs start with BOS.

With ``nsp`` a masked-LM model also has BERT's next-sentence head (Sec. 3.1, "Task #2: Next
Sentence Prediction"): the same pooler then a linear layer to two classes, 0 IsNext and 1 NotNext
(BertForPreTraining's).

The [MASK] token is the model's last id, ``src_vocab_size - 1`` (:attr:`EncoderOnly.mask_id`):
an encoder_only model is built with one row more than its tokenizer has pieces, so every
tokenizer serves unchanged, its ids included, and no text can ever encode to [MASK].

The model returns logits; the masking lives in :mod:`transduce.data.encoder_inputs`, the losses in
:mod:`transduce.training.encoder_tasks`.

Legend: B batch, T length, D d_model, V vocabulary (src_vocab_size), K classes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import ModelConfig
from .embeddings import RotaryEmbedding, TokenEmbedding
from .layers import EncoderLayer, init_linear_weights, norm_layer
from .masks import padding_mask
from .transformer import Embedder


class MaskedLMHead(nn.Module):
    """BERT's masked-LM head: LayerNorm(GELU(dense(h))) then the decoder to the vocabulary.

    The decoder's weight is the token embedding when ``tie`` is given (Sec. 3.4's sharing);
    its bias is its own either way, as BERT's (none with ``model.bias=false``). The GELU is
    BERT's erf one whatever ``model.activation`` the layers use.
    """

    def __init__(self, cfg: ModelConfig, tie: TokenEmbedding | None):
        super().__init__()
        self.dense = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps, bias=cfg.bias)
        self.decoder = nn.Linear(cfg.d_model, cfg.src_vocab_size, bias=False)
        self.bias = nn.Parameter(torch.zeros(cfg.src_vocab_size)) if cfg.bias else None
        if tie is not None:
            self.decoder.weight = tie.weight

    def forward(self, states: Tensor) -> Tensor:
        """(..., D) -> (..., V)."""
        logits = self.decoder(self.norm(F.gelu(self.dense(states))))     # (..., V)
        return logits if self.bias is None else logits + self.bias


class ClassificationHead(nn.Module):
    """BERT's pooler tanh(dense(h[CLS])), dropout, then a linear layer to ``n_classes`` classes
    (the next-sentence head: 2, without dropout, as BertForPreTraining's)."""

    def __init__(self, cfg: ModelConfig, n_classes: int, dropout: float):
        super().__init__()
        self.pooler = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(cfg.d_model, n_classes, bias=cfg.bias)

    def forward(self, states: Tensor) -> Tensor:
        """(B, T, D) -> (B, K), from the first position's state."""
        pooled = torch.tanh(self.pooler(states[:, 0]))                    # (B, D)
        return self.classifier(self.dropout(pooled))


class EncoderOnly(nn.Module):
    """A BERT-style encoder (``model.arch=encoder_only``) with a masked-LM or a classification head.

    Args:
        cfg: the model configuration; uses ``src_vocab_size`` and ``n_encoder_layers``.

    Examples:
        >>> from transduce.config import model_preset
        >>> cfg = model_preset("tiny", arch="encoder_only", src_vocab_size=100, tgt_vocab_size=100)
        >>> model = EncoderOnly(cfg)
        >>> ids = torch.tensor([[1, 5, model.mask_id, 7, 2]])
        >>> tuple(model.mlm_logits(model(ids)).shape)
        (1, 5, 100)
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        tokens = TokenEmbedding(cfg.src_vocab_size, cfg.d_model, cfg.embedding_pad_id, cfg.scale_embeddings)
        self.embed = Embedder(cfg, tokens)
        rope = RotaryEmbedding(cfg.d_head, cfg.rope_base) if cfg.positions == "rope" else None
        self.layers = nn.ModuleList(EncoderLayer(cfg, rope, i) for i in range(cfg.n_encoder_layers))
        # Pre-LN leaves the residual stream unnormalised, so the stack ends with a LayerNorm.
        pre = cfg.norm == "pre"
        self.final_norm = norm_layer(cfg) if pre else None
        self.mlm_head = None if cfg.n_classes else MaskedLMHead(cfg, tokens if cfg.tie_output else None)
        self.cls_head = ClassificationHead(cfg, cfg.n_classes, cfg.dropout) if cfg.n_classes else None
        self.nsp_head = ClassificationHead(cfg, 2, 0.0) if cfg.nsp else None
        self._init_weights()

    def _init_weights(self) -> None:
        """Xavier-uniform linear weights, zero biases, as :class:`~transduce.model.Transformer`
        (the tied decoder keeps the embedding's initialisation)."""
        tied = self.mlm_head.decoder if self.mlm_head is not None and self.config.tie_output else None
        init_linear_weights(self, skip=(tied,) if tied is not None else ())

    @property
    def mask_id(self) -> int:
        """The [MASK] token: the last id of the vocabulary (see the module docstring)."""
        return self.config.src_vocab_size - 1

    def forward(self, ids: Tensor, token_types: Tensor | None = None) -> Tensor:
        """Token ids (B, T) (and token types (B, T), type 0 if None) -> final states (B, T, D).

        Every position attends to every non-pad position (no causal mask).
        """
        mask = padding_mask(ids, self.config.pad_id)                     # (B, 1, 1, T)
        x = self.embed(ids, token_types=token_types)                     # (B, T, D)
        for layer in self.layers:
            x, _ = layer(x, mask)
        return x if self.final_norm is None else self.final_norm(x)

    def mlm_logits(self, states: Tensor) -> Tensor:
        """Masked-LM logits of states (..., D) -> (..., V); pass only the masked positions'
        states (``states[labels != pad]``) to project just those."""
        if self.mlm_head is None:
            raise ValueError(f"this model has a classification head (model.n_classes={self.config.n_classes}), "
                             "not a masked-LM head")
        return self.mlm_head(states)

    def classify(self, states: Tensor) -> Tensor:
        """Class logits from the first ([CLS], BOS) position of states (B, T, D) -> (B, K)."""
        if self.cls_head is None:
            raise ValueError("this model has a masked-LM head, not a classification head (model.n_classes=0)")
        return self.cls_head(states)

    def next_sentence_logits(self, states: Tensor) -> Tensor:
        """IsNext (0) / NotNext (1) logits from the first position of states (B, T, D) -> (B, 2)."""
        if self.nsp_head is None:
            raise ValueError("this model has no next-sentence head (model.nsp=false)")
        return self.nsp_head(states)

    def num_parameters(self) -> int:
        """Number of distinct trainable parameters (tied matrices counted once)."""
        return sum(p.numel() for p in self.parameters())
