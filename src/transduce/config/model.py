"""The model section: the Transformer's shape and options, named presets, what a model is for."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from .attention import AttentionConfig
from .base import check, from_dict, non_negative, one_of, positive, typecheck
from .family import ARCHS, FAMILIES, Family


@dataclass(frozen=True)
class ModelConfig:
    """The Transformer's shape and options. Defaults are the paper's base model (Table 3)."""

    arch: str = "encoder_decoder"
    """``encoder_decoder`` (the paper); ``decoder_only``: a GPT-style language model (Radford et al.,
    2019), one causal stack of ``n_decoder_layers`` blocks over ``tgt_vocab_size`` tokens
    (model/lm.py); ``encoder_only``: a BERT-style encoder (Devlin et al., 2019,
    https://arxiv.org/abs/1810.04805) of ``n_encoder_layers`` blocks over ``src_vocab_size``
    tokens, no decoder (model/encoder_only.py)."""
    src_vocab_size: int = 37000
    """Source vocabulary size (training sets it from the tokenizer)."""
    tgt_vocab_size: int = 37000
    """Target vocabulary size: the output layer's (training sets it from the tokenizer)."""
    d_model: int = 512
    """Width of the embeddings and of every sublayer's output (D, Sec. 3.1)."""
    n_heads: int = 8
    """Attention heads (H, Sec. 3.2.2); must divide ``d_model`` unless ``head_dim`` is set."""
    head_dim: int | None = None
    """Width of each head (d_k = d_v, Sec. 3.2.2): the queries, keys and values are projected
    from d_model to n_heads * head_dim and the heads' concatenation back to d_model (W^O).
    Empty: d_model / n_heads (the paper). The paper's Table 3 row (B) varies it; T5 1.1 and mT5
    set it apart from d_model / n_heads (HF ``d_kv``)."""
    n_encoder_layers: int = 6
    """Encoder blocks (N, Sec. 3.1)."""
    n_decoder_layers: int = 6
    """Decoder blocks (N, Sec. 3.1)."""
    d_ff: int = 2048
    """Inner width of the position-wise feed-forward networks (Sec. 3.3)."""
    dropout: float = 0.1
    """Residual dropout: on each sublayer's output and on the embedding sums (Sec. 5.4)."""
    attention_dropout: float = 0.0
    """Dropout on the attention weights."""
    activation_dropout: float = 0.0
    """Dropout on the feed-forward networks' inner activations."""
    activation: str = "relu"
    """The feed-forward activation: ``relu`` (the paper), ``gelu`` (Hendrycks & Gimpel, 2016),
    ``gelu_tanh`` (its tanh approximation, GPT-2), ``silu`` (Swish/SiLU, Marian's OPUS-MT models)
    or the gated FFNs of Shazeer (2020, https://arxiv.org/abs/2002.05202): ``swiglu``, or ``geglu``
    (GELU, tanh approximation: T5 1.1 and mT5's "gated-gelu")."""
    norm: str = "post"
    """``post``: LayerNorm after each residual sum (the paper); ``pre``: pre-LN blocks with a final
    LayerNorm (Xiong et al., 2020)."""
    norm_kind: str = "layer"
    """``layer``: LayerNorm (Ba et al., 2016); ``rms``: RMSNorm (Zhang & Sennrich, 2019,
    https://arxiv.org/abs/1910.07467), a scale without mean subtraction or bias, as T5's."""
    positions: str = "sinusoidal"
    """``sinusoidal`` (Sec. 3.5), ``fairseq``: fairseq's sinusoidal table (sines then cosines,
    frequencies 10000^(-i/(D/2-1)), positions counted from 2), as M2M-100 and NLLB-200 have it
    (:func:`~transduce.model.embeddings.fairseq_table`), ``learned`` absolute positions
    (BERT/GPT) or ``rope`` rotary embeddings (Su et al., 2021; needs an even head dimension) or
    ``relative``: T5's bucketed relative position bias added to the self-attention scores,
    bidirectional in the encoder and causal in the decoder, one table per stack shared by its
    layers (Raffel et al., 2020, Sec. 2.1, https://arxiv.org/abs/1910.10683; arch=encoder_decoder,
    full attention)."""
    relative_buckets: int = 32
    """With ``positions: relative``: the number of buckets (distances below half of them, a
    quarter in the encoder's each direction, have a bucket each; longer ones share log-spaced
    buckets)."""
    relative_max_distance: int = 128
    """With ``positions: relative``: the distance from which all distances share the last bucket."""
    max_positions: int = 1024
    """The longest sequence the model takes: the learned position table's size, the span of
    linformer's projections, and where generation stops."""
    rope_base: float = 10000.0
    """The base of RoPE's rotation frequencies."""
    bias: bool = True
    """Biases in the linear layers; False: bias-free (PaLM)."""
    share_embeddings: bool = True
    """One embedding matrix for source and target (Sec. 3.4); needs a joint vocabulary."""
    tie_output: bool = True
    """The output projection is the target embedding matrix (Sec. 3.4)."""
    scale_embeddings: bool = True
    """Embeddings multiplied by sqrt(d_model) (Sec. 3.4)."""
    scale_attention: bool = True
    """Scores divided by sqrt(d_k) (Eq. 1); False: not, as T5, which folds the factor into the
    initialisation of the query projection."""
    scale_output: bool = False
    """The decoder's output multiplied by d_model^-0.5 before the tied output projection (T5,
    whose embeddings are not scaled up; needs ``tie_output``)."""
    layer_norm_eps: float = 1e-5
    """LayerNorm's epsilon."""
    pad_id: int = 0
    """The padding token's id."""
    bos_id: int = 1
    """The beginning-of-sequence token's id."""
    eos_id: int = 2
    """The end-of-sequence token's id."""
    bos_in_softmax: bool = True
    """BOS is one of the output's classes: its logit counts in the softmax that decoding and
    scoring normalise by. False: it is left out (-inf before the log-softmax), as in an imported
    T5, whose decoder starts from PAD and has no BOS: our BOS is PAD's row again, and counting it
    would lower every log-probability by log(1 + p(PAD)) against T5's. Training's loss still
    counts it (a class that is never a target)."""
    embed_norm: bool = False
    """LayerNorm after the embedding sum, as BERT (encoder_only) and mBART (encoder_decoder: one
    per stack, ``layernorm_embedding``)."""
    type_vocab_size: int = 0
    """BERT's token-type (segment) embeddings; 0 = none (encoder_only)."""
    n_classes: int = 0
    """A pooled classification head over this many classes instead of the masked-LM head;
    0 = the masked-LM head (encoder_only)."""
    nsp: bool = False
    """BERT's next-sentence head beside the masked-LM head (encoder_only, ``n_classes`` 0, two
    token types): masked-LM training then also predicts whether the second of two lines follows
    the first (BertForPreTraining)."""
    output_bias: bool = False
    """A bias on the output projection (Marian's ``final_logits_bias``; encoder_decoder only)."""
    labels: tuple = ()
    """The class names in id order, set by classification training from its data."""
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    """Which keys each query sees (:class:`~transduce.config.attention.AttentionConfig`): the
    paper's full attention, or a long-input kind with its settings, as one section
    (``attention: {kind: local, window: 128}``)."""

    def __post_init__(self) -> None:
        if isinstance(self.labels, list):
            object.__setattr__(self, "labels", tuple(self.labels))
        if isinstance(self.attention, dict):  # the YAML form: a mapping of the section's keys
            object.__setattr__(self, "attention", from_dict(AttentionConfig, self.attention, "model.attention"))
        check(isinstance(self.attention, AttentionConfig), "model.attention",
              f"must be a mapping of its keys (kind, window, ...); got {self.attention!r}")
        typecheck(self, "model")
        self._check_shape()
        self._check_choices()
        self._check_encoder_only()
        check(not self.output_bias or self.arch == "encoder_decoder", "model.output_bias",
              f"needs model.arch=encoder_decoder; got arch={self.arch}")
        self._check_attention()
        self._check_positions_and_norm()
        self._check_vocabulary()

    def _check_shape(self) -> None:
        positive(self, "model", ("src_vocab_size", "tgt_vocab_size", "d_model", "n_heads", "head_dim", "d_ff",
                                 "max_positions"))
        non_negative(self, "model", ("n_encoder_layers", "n_decoder_layers"))
        check(self.head_dim is not None or self.d_model % self.n_heads == 0, "model.d_model",
              f"{self.d_model} is not divisible by model.n_heads={self.n_heads} (or set model.head_dim)")
        for k in ("dropout", "attention_dropout", "activation_dropout"):
            v = getattr(self, k)
            check(0.0 <= v < 1.0, f"model.{k}", f"must be in [0, 1); got {v}")

    def _check_choices(self) -> None:
        one_of(self.arch, "model.arch", ARCHS)
        one_of(self.activation, "model.activation", ("relu", "gelu", "gelu_tanh", "silu", "swiglu", "geglu"))
        one_of(self.norm, "model.norm", ("post", "pre"))
        one_of(self.norm_kind, "model.norm_kind", ("layer", "rms"))
        one_of(self.positions, "model.positions", ("sinusoidal", "fairseq", "learned", "rope", "relative"))

    def _check_encoder_only(self) -> None:
        non_negative(self, "model", ("type_vocab_size", "n_classes"))
        if self.arch == "encoder_only":
            check(self.n_encoder_layers > 0, "model.n_encoder_layers", "must be positive for model.arch=encoder_only")
            check(self.n_classes != 1, "model.n_classes", "must be 0 (masked-LM head) or at least 2 classes; got 1")
            check(not self.labels or len(self.labels) == self.n_classes, "model.labels",
                  f"names {len(self.labels)} classes; model.n_classes is {self.n_classes}")
            check(not self.nsp or (self.n_classes == 0 and self.type_vocab_size >= 2), "model.nsp",
                  f"needs the masked-LM head (model.n_classes=0; got {self.n_classes}) and two token types "
                  f"(model.type_vocab_size>=2; got {self.type_vocab_size})")
            return
        check(not self.embed_norm or self.arch == "encoder_decoder", "model.embed_norm",
              f"needs model.arch=encoder_only or encoder_decoder; got arch={self.arch}")
        for k in ("type_vocab_size", "n_classes", "labels", "nsp"):
            check(not getattr(self, k), f"model.{k}", f"needs model.arch=encoder_only; got arch={self.arch}")

    def _check_attention(self) -> None:
        """What model.attention needs of the rest of the model (its own keys checked themselves)."""
        a = self.attention
        check(a.kind != "linformer" or 1 <= a.linformer_k <= self.max_positions, "model.attention.linformer_k",
              f"must be in [1, model.max_positions={self.max_positions}]; got {a.linformer_k}")
        for kind in ("linformer", "bigbird"):
            check(not (a.kind == kind and self.arch == "decoder_only"), "model.attention.kind",
                  f"{kind} applies to encoder self-attention only (it is not causal); arch=decoder_only has none")
        for key in ("global_projections", "windows"):  # Longformer's options
            if getattr(a, key):
                check(a.kind == "local" and self.arch == "encoder_only", f"model.attention.{key}",
                      f"needs model.attention.kind=local and model.arch=encoder_only; got kind={a.kind}, "
                      f"arch={self.arch}")
        check(not a.global_projections or self.positions != "rope", "model.attention.global_projections",
              "does not rotate its projections: use learned or sinusoidal positions, not rope")
        check(not a.windows or len(a.windows) == self.n_encoder_layers, "model.attention.windows",
              f"needs one window per encoder layer ({self.n_encoder_layers}); got {len(a.windows)}")

    def _check_positions_and_norm(self) -> None:
        if self.positions == "rope":
            check(self.d_head % 2 == 0, "model.positions",
                  f"rope needs an even head dimension; got {self.d_head}")
        check(self.rope_base > 0, "model.rope_base", "must be positive")
        check(self.positions != "fairseq" or self.d_model >= 4, "model.positions",
              f"fairseq needs model.d_model >= 4 (two frequencies); got {self.d_model}")
        self._check_relative()
        check(not self.scale_output or self.tie_output, "model.scale_output",
              "rescales the input of a tied output projection; needs model.tie_output=true")
        a = self.attention
        check(self.scale_attention or a.full, "model.scale_attention",
              f"false needs full attention; got attention.kind={a.kind}, attention.cross={a.cross}")
        check(self.layer_norm_eps > 0, "model.layer_norm_eps", "must be positive")

    def _check_relative(self) -> None:
        """T5's buckets: half for each direction in the encoder, and of those half exact distances,
        so the unidirectional half-count (relative_buckets / 2) must fall short of the max distance."""
        if self.positions != "relative":
            for k, default in (("relative_buckets", 32), ("relative_max_distance", 128)):
                check(getattr(self, k) == default, f"model.{k}",
                      f"applies to model.positions=relative; got positions={self.positions}")
            return
        check(self.arch == "encoder_decoder", "model.positions",
              f"relative needs model.arch=encoder_decoder; got arch={self.arch}")
        check(self.attention.full, "model.positions", f"relative needs full attention; got attention.kind="
              f"{self.attention.kind}, attention.cross={self.attention.cross}")
        check(self.relative_buckets >= 4 and self.relative_buckets % 2 == 0, "model.relative_buckets",
              f"must be even and >= 4; got {self.relative_buckets}")
        check(self.relative_max_distance > self.relative_buckets // 2, "model.relative_max_distance",
              f"must exceed model.relative_buckets / 2 = {self.relative_buckets // 2}; "
              f"got {self.relative_max_distance}")

    def _check_vocabulary(self) -> None:
        if self.share_embeddings:
            check(self.src_vocab_size == self.tgt_vocab_size, "model.share_embeddings",
                  "needs src_vocab_size == tgt_vocab_size (a joint vocabulary)")
        for k in ("pad_id", "bos_id", "eos_id"):
            v = getattr(self, k)
            check(0 <= v < min(self.src_vocab_size, self.tgt_vocab_size), f"model.{k}",
                  f"must be a valid token id; got {v}")
        check(self.bos_in_softmax or self.bos_id not in (self.pad_id, self.eos_id), "model.bos_in_softmax",
              f"false needs a BOS of its own; got bos_id={self.bos_id}, pad_id={self.pad_id}, eos_id={self.eos_id}")

    @property
    def pad_shared(self) -> bool:
        """Whether PAD is also BOS or EOS (GPT-2's one ``<|endoftext|>``): padding is then no token
        of its own, so padded labels carry :data:`IGNORE_LABEL` (the EOS label counts) and the
        embedding row trains as any other (no ``padding_idx``)."""
        return self.pad_id in (self.bos_id, self.eos_id)

    @property
    def embedding_pad_id(self) -> int | None:
        """The embeddings' ``padding_idx``: PAD, or None where it is also BOS or EOS (:attr:`pad_shared`)."""
        return None if self.pad_shared else self.pad_id

    @property
    def label_pad_id(self) -> int:
        """The value padded label positions carry, which the loss skips: PAD, or
        :data:`IGNORE_LABEL` where PAD is also BOS or EOS (:attr:`pad_shared`)."""
        return IGNORE_LABEL if self.pad_shared else self.pad_id

    @property
    def never_generated(self) -> tuple[int, ...]:
        """The ids search never produces: PAD and BOS, unless one is also EOS (GPT-2's
        ``<|endoftext|>`` begins, ends and pads)."""
        return never_generated(self.pad_id, self.bos_id, self.eos_id)

    @property
    def family(self) -> Family:
        """What its ``arch`` is and does (:data:`~transduce.config.family.FAMILIES`)."""
        return FAMILIES[self.arch]

    @property
    def d_head(self) -> int:
        """Dh: ``head_dim``, or d_model / n_heads when it is not set."""
        return self.head_dim if self.head_dim is not None else self.d_model // self.n_heads

    @property
    def attention_width(self) -> int:
        """H * Dh: the width of the concatenated heads (d_model unless ``head_dim`` is set)."""
        return self.n_heads * self.d_head


MODEL_PRESETS: dict[str, dict[str, Any]] = {
    # Vaswani et al. (2017), Table 3.
    "base": dict(d_model=512, n_heads=8, n_encoder_layers=6, n_decoder_layers=6, d_ff=2048, dropout=0.1),
    "big": dict(d_model=1024, n_heads=16, n_encoder_layers=6, n_decoder_layers=6, d_ff=4096, dropout=0.3),
    # CPU-sized models for demos and tests.
    "small": dict(d_model=256, n_heads=4, n_encoder_layers=3, n_decoder_layers=3, d_ff=1024, dropout=0.1),
    "tiny": dict(d_model=128, n_heads=4, n_encoder_layers=2, n_decoder_layers=2, d_ff=256, dropout=0.1,
                 max_positions=256),
    # Raffel et al. (2020): t5-small's shape and options (T5 1.0: ReLU, tied output).
    "t5-small": dict(d_model=512, n_heads=8, n_encoder_layers=6, n_decoder_layers=6, d_ff=2048, dropout=0.1,
                     norm="pre", norm_kind="rms", positions="relative", bias=False, scale_embeddings=False,
                     scale_attention=False, scale_output=True, layer_norm_eps=1e-6, max_positions=512),
}


# The padded labels of a model whose PAD is also BOS or EOS (``ModelConfig.label_pad_id``): no token
# id, as transformers' -100.
IGNORE_LABEL = -100


def never_generated(pad_id: int, bos_id: int, eos_id: int) -> tuple[int, ...]:
    """The ids search never produces: PAD and BOS, unless one is also EOS (GPT-2's
    ``<|endoftext|>`` begins, ends and pads)."""
    return tuple(sorted({pad_id, bos_id} - {eos_id}))


def model_preset(name: str, **overrides: Any) -> ModelConfig:
    """A named model shape ("base", "big", "small", "tiny") with field overrides."""
    check(name in MODEL_PRESETS, "model.preset", f"unknown preset {name!r}; known: {', '.join(MODEL_PRESETS)}")
    return ModelConfig(**{**MODEL_PRESETS[name], **overrides})


def with_vocab(cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int) -> ModelConfig:
    """The same model shape with the vocabulary sizes a tokenizer produced."""
    return replace(cfg, src_vocab_size=src_vocab_size, tgt_vocab_size=tgt_vocab_size)
