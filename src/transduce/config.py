"""Configuration: one frozen dataclass per concern, validated on creation, YAML in and out.

A run is described by :class:`RunConfig` = model + data + train + decode. Every field has a
default; a YAML file only needs the fields it changes. ``key=value`` overrides
(``train.max_steps=100``) are parsed with YAML's scalar rules. Any bad value raises
:class:`~transduce.errors.ConfigError` whose one-line message names the key.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

import yaml

from .atomic import atomic_write_text
from .errors import ConfigError, one_line

__all__ = [
    "ModelConfig", "DataConfig", "TrainConfig", "DecodeConfig", "RunConfig",
    "model_preset", "MODEL_PRESETS", "load_run_config", "save_yaml", "apply_overrides",
]


def _check(cond: bool, key: str, msg: str) -> None:
    if not cond:
        raise ConfigError(f"{key}: {msg}")


def _one_of(value: Any, key: str, choices: tuple) -> None:
    _check(value in choices, key, f"must be one of {', '.join(map(str, choices))}; got {value!r}")


# Numbers such as 3e-4 or 1E5, which YAML 1.1 (PyYAML) reads as strings for want of a dot.
_YAML_FLOAT_AS_STR = re.compile(r"[-+]?[0-9]+[eE][-+]?[0-9]+")


def _typecheck(obj: Any, section: str) -> None:
    """Check each field's value against its annotation (int, float, bool, str, Optional)."""
    hints = get_type_hints(type(obj))
    for f in fields(obj):
        value, tp = getattr(obj, f.name), hints[f.name]
        key = f"{section}.{f.name}"
        allowed = tuple(a for a in get_args(tp)) if get_origin(tp) is not None else (tp,)
        if value is None:
            _check(type(None) in allowed, key, "must not be empty")
            continue
        if float in allowed and isinstance(value, int) and not isinstance(value, bool):
            object.__setattr__(obj, f.name, float(value))
            continue
        if float in allowed and isinstance(value, str) and _YAML_FLOAT_AS_STR.fullmatch(value.strip()):
            object.__setattr__(obj, f.name, float(value))  # YAML 1.1 reads "3e-4" (no dot) as a string
            continue
        ok = any(isinstance(value, a) and not (a is int and isinstance(value, bool))
                 for a in allowed if isinstance(a, type))
        names = "/".join(a.__name__ for a in allowed if a is not type(None))
        _check(ok, key, f"must be {names}; got {value!r}")


ARCHS = ("encoder_decoder", "decoder_only", "encoder_only")
TASKS = ("translation", "lm", "mlm", "classify")
# encoder_only trains "classify" instead when model.n_classes >= 2 (RunConfig.task)
EXTEND_VOCAB = 1000  # new pieces at most per tokenizer model, when --extend-vocab gives no number
TASK_OF_ARCH = {"encoder_decoder": "translation", "decoder_only": "lm", "encoder_only": "mlm"}


@dataclass(frozen=True)
class ModelConfig:
    """The Transformer's shape and options. Defaults are the paper's base model (Table 3).

    Options beyond the paper (each a field):
      norm="pre"          pre-LN residual blocks with a final LayerNorm (Xiong et al., 2020)
      positions="learned" learned absolute positions (BERT/GPT); "rope" rotary (Su et al., 2021)
      activation="gelu"   (Hendrycks & Gimpel, 2016); "gelu_tanh" its tanh approximation (GPT-2);
                          "silu" Swish/SiLU (Marian's OPUS-MT models); "swiglu" gated FFN (Shazeer, 2020)
      output_bias=True    a bias on the output projection (Marian's final_logits_bias;
                          encoder_decoder only)
      bias=False          bias-free linear layers (PaLM)
      share_embeddings=False / tie_output=False   untied embedding matrices (Sec. 3.4 ties them)
      arch="decoder_only" a GPT-style language model (Radford et al., 2019): one causal stack of
                          n_decoder_layers self-attention blocks over tgt_vocab_size tokens
                          (model/lm.py)
      arch="encoder_only" a BERT-style encoder (Devlin et al., 2019, https://arxiv.org/abs/1810.04805):
                          src_vocab_size and n_encoder_layers, no decoder (model/encoder_only.py)
      embed_norm=True     LayerNorm after the embedding sum, as BERT (encoder_only)
      type_vocab_size=2   BERT's token-type (segment) embeddings; 0 = none (encoder_only)
      n_classes=K         a pooled classification head over K classes instead of the masked-LM
                          head; 0 = the masked-LM head (encoder_only)
      attention="local"   self-attention over a sliding window of ``attention_window`` positions
                          each side (causal in the decoder), plus ``global_tokens`` (the first G
                          positions: every query sees them, and they see every position), as
                          Longformer (Beltagy et al., 2020, https://arxiv.org/abs/2004.05150);
                          O(T * W) time and memory
      attention="linformer"  encoder self-attention with keys and values projected along the
                          sequence to ``linformer_k`` rows (Wang et al., 2020,
                          https://arxiv.org/abs/2006.04768); the projections span ``max_positions``
                          positions (the longest sequence this model takes). It is not causal, so
                          decoder self-attention stays full (arch=decoder_only refuses it)
      cross_attention="local"  encoder-decoder attention over the source positions within
                          ``attention_window`` of the target position (for long, monotone,
                          similar-length pairs such as documents); "full" (the paper) by default
    """

    arch: str = "encoder_decoder"
    src_vocab_size: int = 37000
    tgt_vocab_size: int = 37000
    d_model: int = 512
    n_heads: int = 8
    n_encoder_layers: int = 6
    n_decoder_layers: int = 6
    d_ff: int = 2048
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    activation: str = "relu"
    norm: str = "post"
    positions: str = "sinusoidal"
    max_positions: int = 1024
    rope_base: float = 10000.0
    bias: bool = True
    share_embeddings: bool = True
    tie_output: bool = True
    scale_embeddings: bool = True
    layer_norm_eps: float = 1e-5
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    embed_norm: bool = False
    type_vocab_size: int = 0
    n_classes: int = 0
    output_bias: bool = False
    labels: tuple = ()  # the class names in id order, set by classification training from its data
    attention: str = "full"
    cross_attention: str = "full"
    attention_window: int = 256
    global_tokens: int = 0
    linformer_k: int = 256

    def __post_init__(self) -> None:
        if isinstance(self.labels, list):
            object.__setattr__(self, "labels", tuple(self.labels))
        _typecheck(self, "model")
        for k in ("src_vocab_size", "tgt_vocab_size", "d_model", "n_heads", "d_ff", "max_positions"):
            _check(getattr(self, k) > 0, f"model.{k}", f"must be positive; got {getattr(self, k)}")
        for k in ("n_encoder_layers", "n_decoder_layers"):
            _check(getattr(self, k) >= 0, f"model.{k}", f"must be >= 0; got {getattr(self, k)}")
        _check(self.d_model % self.n_heads == 0, "model.d_model",
               f"{self.d_model} is not divisible by model.n_heads={self.n_heads}")
        for k in ("dropout", "attention_dropout", "activation_dropout"):
            v = getattr(self, k)
            _check(0.0 <= v < 1.0, f"model.{k}", f"must be in [0, 1); got {v}")
        _one_of(self.arch, "model.arch", ARCHS)
        _one_of(self.activation, "model.activation", ("relu", "gelu", "gelu_tanh", "silu", "swiglu"))
        _one_of(self.norm, "model.norm", ("post", "pre"))
        _one_of(self.positions, "model.positions", ("sinusoidal", "learned", "rope"))
        self._check_encoder_only()
        _check(not self.output_bias or self.arch == "encoder_decoder", "model.output_bias",
               f"needs model.arch=encoder_decoder; got arch={self.arch}")
        self._check_attention()
        if self.positions == "rope":
            _check(self.head_dim % 2 == 0, "model.positions",
                   f"rope needs an even head dimension; d_model/n_heads = {self.head_dim}")
        _check(self.rope_base > 0, "model.rope_base", "must be positive")
        _check(self.layer_norm_eps > 0, "model.layer_norm_eps", "must be positive")
        if self.share_embeddings:
            _check(self.src_vocab_size == self.tgt_vocab_size, "model.share_embeddings",
                   "needs src_vocab_size == tgt_vocab_size (a joint vocabulary)")
        for k in ("pad_id", "bos_id", "eos_id"):
            v = getattr(self, k)
            _check(0 <= v < min(self.src_vocab_size, self.tgt_vocab_size), f"model.{k}",
                   f"must be a valid token id; got {v}")

    def _check_encoder_only(self) -> None:
        for k in ("type_vocab_size", "n_classes"):
            _check(getattr(self, k) >= 0, f"model.{k}", f"must be >= 0; got {getattr(self, k)}")
        if self.arch == "encoder_only":
            _check(self.n_encoder_layers > 0, "model.n_encoder_layers", "must be positive for model.arch=encoder_only")
            _check(self.n_classes != 1, "model.n_classes", "must be 0 (masked-LM head) or at least 2 classes; got 1")
            _check(not self.labels or len(self.labels) == self.n_classes, "model.labels",
                   f"names {len(self.labels)} classes; model.n_classes is {self.n_classes}")
            return
        for k in ("embed_norm", "type_vocab_size", "n_classes", "labels"):
            _check(not getattr(self, k), f"model.{k}", f"needs model.arch=encoder_only; got arch={self.arch}")

    def _check_attention(self) -> None:
        _one_of(self.attention, "model.attention", ("full", "local", "linformer"))
        _check(self.cross_attention != "linformer", "model.cross_attention",
               "linformer applies to encoder self-attention only; use full or local")
        _one_of(self.cross_attention, "model.cross_attention", ("full", "local"))
        _check(self.attention_window >= 1, "model.attention_window", f"must be >= 1; got {self.attention_window}")
        _check(self.global_tokens >= 0, "model.global_tokens", f"must be >= 0; got {self.global_tokens}")
        _check(self.attention != "linformer" or 1 <= self.linformer_k <= self.max_positions, "model.linformer_k",
               f"must be in [1, model.max_positions={self.max_positions}]; got {self.linformer_k}")
        _check(not (self.attention == "linformer" and self.arch == "decoder_only"), "model.attention",
               "linformer applies to encoder self-attention only (it is not causal); arch=decoder_only has none")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


MODEL_PRESETS: dict[str, dict[str, Any]] = {
    # Vaswani et al. (2017), Table 3.
    "base": dict(d_model=512, n_heads=8, n_encoder_layers=6, n_decoder_layers=6, d_ff=2048, dropout=0.1),
    "big": dict(d_model=1024, n_heads=16, n_encoder_layers=6, n_decoder_layers=6, d_ff=4096, dropout=0.3),
    # CPU-sized models for demos and tests.
    "small": dict(d_model=256, n_heads=4, n_encoder_layers=3, n_decoder_layers=3, d_ff=1024, dropout=0.1),
    "tiny": dict(d_model=128, n_heads=4, n_encoder_layers=2, n_decoder_layers=2, d_ff=256, dropout=0.1,
                 max_positions=256),
}


def model_preset(name: str, **overrides: Any) -> ModelConfig:
    """A named model shape ("base", "big", "small", "tiny") with field overrides."""
    _check(name in MODEL_PRESETS, "model.preset", f"unknown preset {name!r}; known: {', '.join(MODEL_PRESETS)}")
    return ModelConfig(**{**MODEL_PRESETS[name], **overrides})


@dataclass(frozen=True)
class DataConfig:
    """Where the parallel text comes from and how it becomes batches.

    ``corpus``: "toy" (the embedded generated pair, no download), "multi30k" (raw files under
    ``root`` or $TRANSDUCE_MULTI30K), "multi30k_tok" (the same corpus's lowercased, Moses-tokenized
    text in ``root/tok/``, which published Multi30k systems train on; the model then writes
    lowercased tokenized text), or "files" (``train_src``/``train_tgt``/... paths).
    ``reverse`` trains the other direction: every split's pairs are swapped after reading, so
    ``src_lang``/``train_src``... keep naming the corpus as written (``train --reverse``).
    ``bpe_dropout`` > 0 re-segments the training text of ``bpe_dropout_sides`` ("src", "tgt"
    or "both") at random every epoch, each BPE merge skipped with that probability (BPE-dropout,
    Provilkov et al., 2020); validation, test and inference use the usual segmentation.

    A language model (``train.task: lm``) trains on the target side: of a parallel corpus (set
    ``reverse`` for the source side), or of monolingual text given as ``train_tgt``/``valid_tgt``/
    ``test_tgt`` with no ``*_src`` (each line is then stored as both sides of a pair).
    A masked LM (``train.task: mlm``) reads the source side, the encoder's: of a parallel corpus
    (set ``reverse`` for the target side), or of the same monolingual ``*_tgt`` files.
    Classification (``train.task: classify``) reads ``train_src``/``valid_src``/``test_src`` files
    of ``text<TAB>label`` (or sentence pairs' ``text_a<TAB>text_b<TAB>label``) lines
    (:mod:`transduce.data.labelled`) with an existing tokenizer, prepared like any corpus.

    ``prepared``: a directory made by ``transduce prepare`` to train from; the corpus, tokenizer
    and filter settings are then the ones it was prepared with (its ``manifest.json``).
    ``tokenizer``: an existing tokenizer directory to reuse instead of training one; otherwise
    one is trained on a seeded sample of ``tokenizer_sentences`` lines per side.
    """

    corpus: str = "toy"
    root: str | None = None
    src_lang: str = "en"
    tgt_lang: str = "de"
    train_src: str | None = None
    train_tgt: str | None = None
    valid_src: str | None = None
    valid_tgt: str | None = None
    test_src: str | None = None
    test_tgt: str | None = None
    toy_seed: int = 0
    toy_train_size: int = 20000
    toy_valid_size: int = 500
    toy_test_size: int = 500
    vocab_size: int = 8000
    tokenizer_type: str = "bpe"
    joint_vocab: bool = True
    max_len: int = 250
    max_ratio: float = 3.0
    max_tokens: int = 4096
    valid_max_sentences: int | None = None
    reverse: bool = False
    bpe_dropout: float = 0.0
    bpe_dropout_sides: str = "both"
    tokenizer: str | None = None
    tokenizer_sentences: int = 1_000_000
    prepared: str | None = None

    def __post_init__(self) -> None:
        _typecheck(self, "data")
        _one_of(self.corpus, "data.corpus", ("toy", "multi30k", "multi30k_tok", "files"))
        _one_of(self.tokenizer_type, "data.tokenizer_type", ("bpe", "unigram"))
        for k in ("toy_train_size", "toy_valid_size", "toy_test_size", "vocab_size", "max_len", "max_tokens",
                  "tokenizer_sentences"):
            _check(getattr(self, k) > 0, f"data.{k}", f"must be positive; got {getattr(self, k)}")
        _check(self.vocab_size >= 8, "data.vocab_size", "must be at least 8")
        _check(self.max_ratio >= 1.0, "data.max_ratio", f"must be >= 1; got {self.max_ratio}")
        _check(0.0 <= self.bpe_dropout < 1.0, "data.bpe_dropout", f"must be in [0, 1); got {self.bpe_dropout}")
        _one_of(self.bpe_dropout_sides, "data.bpe_dropout_sides", ("src", "tgt", "both"))
        _check(self.bpe_dropout == 0.0 or self.tokenizer_type == "bpe", "data.bpe_dropout",
               "needs data.tokenizer_type=bpe")
        if self.corpus == "files" and self.prepared is None:
            _check(self.train_src is not None or self.train_tgt is not None, "data.train_tgt",
                   "is required when data.corpus=files (with data.train_src, except for a language model's "
                   "monolingual text; train.task classify reads data.train_src alone)")

    @property
    def labelled(self) -> bool:
        """Whether the files are text<TAB>label lines (train.task classify): ``*_src`` without ``*_tgt``."""
        return self.corpus == "files" and self.train_src is not None and self.train_tgt is None


@dataclass(frozen=True)
class TrainConfig:
    """The optimisation recipe. Defaults follow Sec. 5.3-5.4 of the paper."""

    seed: int = 1
    device: str = "auto"
    max_steps: int = 100000
    max_epochs: int | None = None
    max_minutes: float | None = None
    grad_accum: int = 1
    optimizer: str = "adam"
    betas: tuple = (0.9, 0.98)
    eps: float = 1e-9
    weight_decay: float = 0.0
    schedule: str = "noam"
    warmup_steps: int = 4000
    lr: float | None = None
    lr_scale: float = 1.0
    min_lr: float = 0.0
    label_smoothing: float = 0.1
    clip_norm: float | None = None
    precision: str = "fp32"
    compile: bool = False        # torch.compile the model once, with dynamic batch shapes
    pad_multiple: int | None = None  # pad S and T up to a multiple (None: 8 with cuda_graphs, else 1 = none)
    cuda_graphs: bool = False    # the whole step as one CUDA graph per shape bucket (training/graphs.py)
    log_every: int = 50
    eval_every: int = 1000
    save_every: int = 1000
    keep_last: int = 5
    average_last: int | None = None
    patience: int | None = None
    eval_bleu: bool = True
    tensorboard: bool = False    # metrics also as TensorBoard events in RUN_DIR/tensorboard (extra 'tensorboard')
    dist_timeout_s: float = 600.0  # multi-process: collectives give up after this long (a stopped rank: an error)
    max_bad_steps: int = 10
    num_threads: int | None = None
    task: str | None = None      # "translation", "lm" or "mlm"; None: the one model.arch is for (RunConfig.task)
    # a trained model directory to start from (its weights and, unless data.tokenizer/prepared say
    # otherwise, its tokenizer); the model section must describe the same model but for dropouts
    init_from: str | None = None
    # with init_from: append up to this many pieces of the new training text to the model's
    # tokenizer, growing its embeddings (training/vocab.py); ``--extend-vocab`` alone gives EXTEND_VOCAB
    extend_vocab: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.betas, list):
            object.__setattr__(self, "betas", tuple(self.betas))
        _typecheck(self, "train")
        _check(len(self.betas) == 2 and all(0.0 <= float(b) < 1.0 for b in self.betas),
               "train.betas", f"must be two numbers in [0, 1); got {self.betas}")
        _one_of(self.optimizer, "train.optimizer", ("adam", "adamw"))
        _one_of(self.schedule, "train.schedule", ("noam", "inverse_sqrt", "cosine", "linear", "constant"))
        _one_of(self.precision, "train.precision", ("fp32", "bf16", "fp16"))
        if self.task is not None:
            _one_of(self.task, "train.task", TASKS)
        for k in ("max_steps", "grad_accum", "log_every", "eval_every", "save_every", "keep_last",
                  "max_bad_steps"):
            _check(getattr(self, k) > 0, f"train.{k}", f"must be positive; got {getattr(self, k)}")
        _check(self.warmup_steps >= 0, "train.warmup_steps", "must be >= 0")
        _check(self.eps > 0, "train.eps", "must be positive")
        _check(self.weight_decay >= 0, "train.weight_decay", "must be >= 0")
        _check(self.lr is None or self.lr > 0, "train.lr", "must be positive")
        _check(self.lr_scale > 0, "train.lr_scale", "must be positive")
        _check(0.0 <= self.label_smoothing < 1.0, "train.label_smoothing", "must be in [0, 1)")
        _check(self.clip_norm is None or self.clip_norm > 0, "train.clip_norm", "must be positive")
        _check(self.max_minutes is None or self.max_minutes > 0, "train.max_minutes", "must be positive")
        _check(self.dist_timeout_s > 0, "train.dist_timeout_s", "must be positive")
        _check(self.patience is None or self.patience > 0, "train.patience", "must be positive")
        _check(self.average_last is None or 0 < self.average_last <= self.keep_last, "train.average_last",
               f"must be between 1 and train.keep_last ({self.keep_last})")
        _check(self.schedule == "noam" or self.lr is not None, "train.lr",
               f"is required by train.schedule={self.schedule}")
        _check(self.extend_vocab is None or self.extend_vocab > 0, "train.extend_vocab",
               f"must be a positive number of new pieces; got {self.extend_vocab}")
        _check(self.extend_vocab is None or self.init_from is not None, "train.extend_vocab",
               "needs train.init_from (--init-from MODEL_DIR): the model whose vocabulary it extends")
        _check(self.pad_multiple is None or self.pad_multiple > 0, "train.pad_multiple",
               f"must be positive; got {self.pad_multiple}")
        if self.cuda_graphs:
            _check(self.grad_accum == 1, "train.cuda_graphs", f"needs train.grad_accum 1; got {self.grad_accum}")
            _check(self.precision != "fp16", "train.cuda_graphs",
                   "needs train.precision fp32 or bf16 (fp16's loss scaler decides on the host)")
            _check(not self.compile, "train.cuda_graphs", "cannot be combined with train.compile; choose one")


@dataclass(frozen=True)
class DecodeConfig:
    """Search settings. Defaults are the paper's (Sec. 6.1): beam 4, alpha 0.6, max len src+50.

    Saved with a trained model (``decode`` in its config.yaml) and used by ``translate``,
    ``evaluate``, ``serve`` and :class:`~transduce.inference.Translator` unless told otherwise.
    ``min_len``: no EOS before this many output tokens. ``stop``: when beam search ends a
    sentence (see :mod:`transduce.inference.search.beam`). With a draft model (speculative
    decoding, :mod:`transduce.inference.search.speculative`): it proposes at most
    ``draft_tokens`` tokens per step of the model, and stops proposing in a step once its latest
    token's probability is below ``draft_threshold`` (0: always ``draft_tokens``); neither
    changes the output.
    """

    beam: int = 4
    lenpen: float = 0.6
    max_len_a: float = 1.0
    max_len_b: int = 50
    min_len: int = 0
    nbest: int = 1
    batch_tokens: int = 4096
    max_input_len: int = 1022
    stop: str = "k_finished"
    draft_tokens: int = 4
    draft_threshold: float = 0.0

    def __post_init__(self) -> None:
        _typecheck(self, "decode")
        _check(self.draft_tokens >= 1, "decode.draft_tokens", f"must be >= 1; got {self.draft_tokens}")
        _check(0.0 <= self.draft_threshold < 1.0, "decode.draft_threshold",
               f"must be in [0, 1); got {self.draft_threshold}")
        _check(self.min_len >= 0, "decode.min_len", f"must be >= 0; got {self.min_len}")
        _one_of(self.stop, "decode.stop", ("k_finished", "best_finished"))
        for k in ("beam", "nbest", "batch_tokens", "max_input_len"):
            _check(getattr(self, k) > 0, f"decode.{k}", f"must be positive; got {getattr(self, k)}")
        _check(self.nbest <= self.beam, "decode.nbest", f"must be <= decode.beam ({self.beam})")
        _check(self.lenpen >= 0, "decode.lenpen", "must be >= 0")
        _check(self.max_len_a >= 0 and self.max_len_b >= 0, "decode.max_len_a", "max_len_a/b must be >= 0")


@dataclass(frozen=True)
class RunConfig:
    """Everything a training run needs; what ``transduce train CONFIG.yaml`` reads."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)

    def __post_init__(self) -> None:
        arch, task = self.model.arch, self._task_of_model()
        _check(self.train.task in (None, task), "train.task", f"{self.train.task} does not fit model.arch={arch}"
               + (f" with model.n_classes={self.model.n_classes}" if arch == "encoder_only" else "")
               + f" (it trains {task})")
        if task == "classify":
            self._check_classify()
        elif self.data.corpus == "files" and self.data.prepared is None:
            _check(self.data.train_tgt is not None, "data.train_tgt", "is required when data.corpus=files")
            _check(task != "translation" or self.data.train_src is not None, "data.train_src", "is required when "
                   "data.corpus=files (only a language model or masked LM trains on data.train_tgt alone)")
        # with learned positions a translation model reads tokens + EOS (source) and BOS + tokens
        # (target), an LM BOS + up to max_len tokens, a masked LM BOS + tokens + EOS
        extra = {"translation": 1, "lm": 1, "mlm": 2, "classify": 2}.get(self.task)
        if extra and self.model.positions == "learned":
            _check(self.data.max_len + extra <= self.model.max_positions, "data.max_len",
                   f"must be at most model.max_positions - {extra} ({self.model.max_positions - extra}) with "
                   f"learned positions for train.task {self.task}; got {self.data.max_len}")
        _check(self.task == "translation" or not self.train.cuda_graphs, "train.cuda_graphs",
               f"is for translation training; use train.compile for train.task {self.task}")

    def _check_classify(self) -> None:
        d = self.data
        if d.prepared is not None:  # a prepared classification set (checked when opened)
            return
        _check(d.corpus == "files", "data.corpus", "train.task classify reads text<TAB>label files "
               f"(data.corpus=files) or a prepared classification set (data.prepared); got {d.corpus}")
        _check(d.train_src is not None, "data.train_src", "is required by train.task classify (text<TAB>label lines)")
        _check(all(getattr(d, f"{k}_tgt") is None for k in ("train", "valid", "test")), "data.train_tgt",
               "train.task classify reads its labels from the data.*_src files (text<TAB>label); set no *_tgt")
        _check(d.tokenizer is not None or self.train.init_from is not None, "data.tokenizer",
               "train.task classify needs an existing tokenizer: data.tokenizer or train.init_from")
        _check(d.bpe_dropout == 0.0, "data.bpe_dropout", "is not supported by train.task classify")

    def _task_of_model(self) -> str:
        return model_task(self.model)

    def with_init_tokenizer(self) -> "RunConfig":
        """This config with ``train.init_from``'s tokenizer as ``data.tokenizer`` when it names no
        other (nor ``data.prepared``): a run that starts from a model reads text as it did."""
        d = self.data
        if self.train.init_from is None or d.tokenizer is not None or d.prepared is not None:
            return self
        return replace(self, data=replace(d, tokenizer=self.train.init_from))

    @property
    def task(self) -> str:
        """What training optimises: ``train.task``, or the task of ``model.arch`` (an encoder_only
        model with ``model.n_classes`` >= 2: classify) when absent."""
        return self.train.task or self._task_of_model()

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RunConfig":
        if not isinstance(d, dict):
            raise ConfigError(f"config: expected a mapping of sections, got {type(d).__name__}")
        sections = {f.name: f.type for f in fields(cls)}
        unknown = set(d) - set(sections) - {"preset"}
        _check(not unknown, "config", f"unknown section(s) {', '.join(sorted(unknown))}; "
               f"known: {', '.join(sections)}")
        for name in sections:
            if d.get(name) is not None and not isinstance(d[name], dict):
                raise ConfigError(f"{name}: expected a mapping, got {type(d[name]).__name__}")
        model = dict(d.get("model") or {})
        preset = model.pop("preset", None) or d.get("preset")
        kwargs = {}
        for name, klass in (("model", ModelConfig), ("data", DataConfig), ("train", TrainConfig),
                            ("decode", DecodeConfig)):
            values = model if name == "model" else dict(d.get(name) or {})
            if name == "model" and preset is not None:
                _check(preset in MODEL_PRESETS, "model.preset", f"unknown preset {preset!r}")
                values = {**MODEL_PRESETS[preset], **values}
            kwargs[name] = _build(klass, values, name)
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["train"]["betas"] = list(self.train.betas)
        return out


def _build(klass: type, values: dict[str, Any], section: str) -> Any:
    if not isinstance(values, dict):
        raise ConfigError(f"{section}: expected a mapping, got {type(values).__name__}")
    known = {f.name for f in fields(klass)}
    unknown = set(values) - known
    _check(not unknown, section, f"unknown key(s) {', '.join(sorted(unknown))}")
    return klass(**values)


def config_from_dict(klass: type, values: dict[str, Any], section: str) -> Any:
    """Build one section's dataclass from a dict, rejecting unknown keys with a ConfigError."""
    return _build(klass, values, section)


def apply_overrides(d: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``section.key=value`` strings to a config dict (values parsed as YAML scalars)."""
    d = {k: dict(v) if isinstance(v, dict) else v for k, v in d.items()}
    for item in overrides:
        key, sep, raw = item.partition("=")
        section, dot, name = key.strip().partition(".")
        _check(bool(sep and dot and name), "--set", f"expected section.key=value, got {item!r}")
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError:
            value = raw
        d.setdefault(section, {})
        _check(isinstance(d[section], dict), key, "section is not a mapping")
        d[section][name] = value
    return d


def read_yaml(path: str | os.PathLike) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: config file not found")
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ConfigError(f"{p}: not valid YAML ({one_line(e)})") from None
    return data or {}


def load_run_config(path: str | os.PathLike | None, overrides: list[str] = ()) -> RunConfig:
    """Read a run config from YAML (or defaults if path is None) and apply overrides. With
    ``train.init_from``, the model keys the config does not give are the initial model's."""
    d = apply_overrides(read_yaml(path) if path is not None else {}, list(overrides))
    return RunConfig.from_dict(with_init_model(d))


def with_init_model(d: dict[str, Any]) -> dict[str, Any]:
    """``d`` with its ``model`` section laid over the ``train.init_from`` model's, when that
    directory holds a model config: fine-tuning configs name only what they change (dropouts).
    A missing directory is left for training to report."""
    init = (d.get("train") or {}).get("init_from") if isinstance(d.get("train"), dict) else None
    saved = Path(str(init)) / "config.yaml" if init else None
    if saved is None or not saved.is_file():
        return d
    model = read_yaml(saved).get("model")
    if not isinstance(model, dict):
        return d
    return {**d, "model": {**model, **(d.get("model") or {})}}


def save_yaml(data: dict[str, Any], path: str | os.PathLike) -> None:
    """Write YAML atomically (temporary file in the same directory, then rename)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(p, yaml.dump(data, Dumper=_Dumper, sort_keys=False))


class _Dumper(yaml.SafeDumper):
    """Safe YAML with tuples (``train.betas``, ``model.labels``) written as lists."""


_Dumper.add_representer(tuple, lambda dumper, value: dumper.represent_list(value))


def model_config_from_dict(d: dict[str, Any]) -> ModelConfig:
    return _build(ModelConfig, d, "model")


def model_task(cfg: ModelConfig) -> str:
    """What a model of ``cfg`` does: the task of its ``arch``, or classify for an encoder_only
    model with ``n_classes``."""
    if cfg.arch == "encoder_only" and cfg.n_classes:
        return "classify"
    return TASK_OF_ARCH[cfg.arch]


def with_vocab(cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int) -> ModelConfig:
    """The same model shape with the vocabulary sizes a tokenizer produced."""
    return replace(cfg, src_vocab_size=src_vocab_size, tgt_vocab_size=tgt_vocab_size)
