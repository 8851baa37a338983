"""The train section: the optimisation recipe and the training loop's settings."""

from __future__ import annotations

from dataclasses import dataclass

from .base import check, one_of, positive, typecheck
from .family import TASKS

EXTEND_VOCAB = 1000  # new pieces at most per tokenizer model when extending gives no number (--extend-vocab)


@dataclass(frozen=True)
class TrainConfig:
    """The optimisation recipe and the training loop's settings. Defaults follow Sec. 5.3-5.4 of the paper."""

    seed: int = 1
    """Seeds the weights' initialisation, the batch order, BPE-dropout and a new tokenizer's sample."""
    device: str = "auto"
    """``cpu``, ``cuda``, ``cuda:N`` or ``auto``."""
    max_steps: int = 100000
    """Optimizer steps to train for (and where the cosine and linear schedules end)."""
    max_epochs: int | None = None
    """Stop after this many passes over the training data; None: no limit."""
    max_minutes: float | None = None
    """Stop after this many minutes of training (the decay schedules then end there); None: no limit."""
    grad_accum: int = 1
    """Batches whose gradients are summed into one optimizer step."""
    optimizer: str = "adam"
    """``adam`` (Sec. 5.3), ``adamw`` (decoupled weight decay of the matrices) or ``adafactor`` (T5's:
    torch's Adafactor, whose step is relative to each weight's RMS, so ``lr`` is a relative step size,
    ~1e-2 for pre-training, 1e-3 for fine-tuning; ``betas`` and ``eps`` are Adam's and unused there)."""
    betas: tuple = (0.9, 0.98)
    """Adam's beta1 and beta2 (Sec. 5.3)."""
    eps: float = 1e-9
    """Adam's epsilon (Sec. 5.3)."""
    weight_decay: float = 0.0
    """Weight decay: added to the gradient with ``adam``; decoupled, of the weight matrices only, with ``adamw``."""
    schedule: str = "noam"
    """The learning-rate schedule (training/schedule.py): ``noam`` (the paper's Eq. 3, scaled by
    ``lr_scale``), or ``inverse_sqrt``, ``cosine``, ``linear`` or ``constant`` with a peak ``lr``."""
    warmup_steps: int = 4000
    """Steps of learning-rate warmup (Sec. 5.3)."""
    lr: float | None = None
    """The peak learning rate; required by every schedule but ``noam``, which refuses it (its rate is
    Eq. 3's, scaled by ``lr_scale``: a ``lr`` there would be silently ignored)."""
    lr_scale: float = 1.0
    """Multiplies the ``noam`` schedule's learning rate."""
    min_lr: float = 0.0
    """Where the ``cosine`` and ``linear`` schedules decay to."""
    guided_alignment_weight: float = 1.0
    """Guided alignment training (training/guided.py): the weight of the loss on the cross-attention
    head ``decode.alignment_layer``/``decode.alignment_head`` (head 0 when unset) towards the training
    data's word alignments (``data.train_alignments``); used only when the data has them; 0: off."""
    label_smoothing: float = 0.1
    """Label smoothing epsilon (Sec. 5.4)."""
    clip_norm: float | None = None
    """Clip the gradients' global norm to this; None: no clipping."""
    precision: str = "fp32"
    """``fp32``, ``bf16`` or ``fp16`` (mixed precision, with a loss scaler)."""
    compile: bool = False
    """``torch.compile`` the model once, with dynamic batch shapes."""
    pad_multiple: int | None = None
    """Pad S and T up to a multiple of this; None: 8 with ``cuda_graphs``, else 1 (none)."""
    cuda_graphs: bool = False
    """Run the whole step as one CUDA graph per shape bucket (training/cuda_graphs.py)."""
    log_every: int = 50
    """Steps between log records (metrics.jsonl)."""
    eval_every: int = 1000
    """Steps between validations."""
    save_every: int = 1000
    """Steps between checkpoints."""
    keep_last: int = 5
    """Checkpoints kept; older ones are deleted."""
    average_last: int | None = None
    """The final model is the average of this many last checkpoints (at most ``keep_last``); None: the last."""
    ema_decay: float = 0.0
    """Keep an exponential moving average of the weights with this decay (e.g. 0.999), used for
    validation, the best and the final model (training/ema.py); 0: off."""
    patience: int | None = None
    """Stop after this many validations without improvement; None: never."""
    eval_bleu: bool = True
    """Validation also decodes and scores BLEU (translation)."""
    tensorboard: bool = False
    """Also write metrics as TensorBoard events in RUN_DIR/tensorboard (extra 'tensorboard')."""
    fsdp: bool = False
    """Multi-process: shard parameters, gradients and optimizer state across the ranks (PyTorch
    FSDP2, training/sharding.py) instead of replicating them (DDP); checkpoints stay unsharded.
    In a single process there is nothing to shard: it trains as without."""
    dist_timeout_s: float = 600.0
    """Multi-process: collectives give up after this long (a stopped rank becomes an error)."""
    max_bad_steps: int = 10
    """Steps in a row with a non-finite loss or gradient tolerated (skipped) before stopping."""
    threads: int | None = None
    """CPU threads for torch; None: torch's default (as ``runtime.threads``; an older config's
    ``train.num_threads`` is read as this)."""
    task: str | None = None
    """``translation``, ``lm``, ``mlm``, ``classify`` or ``span`` (T5's span-corruption
    pretraining of an encoder-decoder, :mod:`transduce.data.span_corruption`); None: the one the
    model is for (:attr:`RunConfig.task`)."""
    init_from: str | None = None
    """A trained model directory to start from: its weights and, unless ``data.tokenizer`` or
    ``data.prepared`` say otherwise, its tokenizer. The model section must describe the same model
    but for dropouts; the keys it does not give are that model's."""
    freeze: tuple = ()
    """Parameter name prefixes whose parameters are not trained (e.g. ``[embed., layers.0.]``: the
    embeddings and the first layer), for fine-tuning; each must name some parameter."""
    head_lr: float | None = None
    """The peak learning rate of the output heads (``cls_head.``, ``mlm_head.``, ``nsp_head.``,
    ``output_proj.``): a new head often wants more than the pre-trained body; None: ``lr``. The
    schedule scales it as it scales ``lr``; needs a schedule with a peak ``lr`` (not noam)."""
    extend_vocab: int | None = None
    """With ``init_from``: append up to this many pieces of the new training text to the model's
    tokenizer, growing its embeddings (training/vocab.py)."""
    qat: bool = False
    """Quantisation-aware training: the linear layers compute with their weights and inputs rounded
    to int8 as ``transduce quantize`` (static int8) will round them (training/qat.py); usually a
    short fine-tune from ``init_from``. The saved model is a float model for ``transduce quantize``."""

    def __post_init__(self) -> None:
        for key in ("betas", "freeze"):
            if isinstance(getattr(self, key), list):
                object.__setattr__(self, key, tuple(getattr(self, key)))
        typecheck(self, "train")
        self._check_optimizer()
        self._check_loop()
        self._check_init()
        self._check_fine_tuning()
        self._check_speed()
        check(self.guided_alignment_weight >= 0, "train.guided_alignment_weight",
              f"must be >= 0; got {self.guided_alignment_weight}")

    def _check_optimizer(self) -> None:
        check(len(self.betas) == 2 and all(0.0 <= float(b) < 1.0 for b in self.betas),
              "train.betas", f"must be two numbers in [0, 1); got {self.betas}")
        one_of(self.optimizer, "train.optimizer", ("adam", "adamw", "adafactor"))
        one_of(self.schedule, "train.schedule", ("noam", "inverse_sqrt", "cosine", "linear", "constant"))
        one_of(self.precision, "train.precision", ("fp32", "bf16", "fp16"))
        if self.task is not None:
            one_of(self.task, "train.task", tuple(TASKS))

    def _check_loop(self) -> None:
        positive(self, "train", ("max_steps", "grad_accum", "log_every", "eval_every", "save_every", "keep_last",
                                 "max_bad_steps"))
        check(self.warmup_steps >= 0, "train.warmup_steps", "must be >= 0")
        check(self.eps > 0, "train.eps", "must be positive")
        check(self.weight_decay >= 0, "train.weight_decay", "must be >= 0")
        check(self.lr is None or self.lr > 0, "train.lr", "must be positive")
        check(self.lr_scale > 0, "train.lr_scale", "must be positive")
        check(0.0 <= self.label_smoothing < 1.0, "train.label_smoothing", "must be in [0, 1)")
        check(self.clip_norm is None or self.clip_norm > 0, "train.clip_norm", "must be positive")
        check(self.max_minutes is None or self.max_minutes > 0, "train.max_minutes", "must be positive")
        check(self.dist_timeout_s > 0, "train.dist_timeout_s", "must be positive")
        check(0.0 <= self.ema_decay < 1.0, "train.ema_decay", f"must be in [0, 1) (0: off); got {self.ema_decay}")
        check(self.patience is None or self.patience > 0, "train.patience", "must be positive")
        check(self.average_last is None or 0 < self.average_last <= self.keep_last, "train.average_last",
              f"must be between 1 and train.keep_last ({self.keep_last})")
        check(self.schedule == "noam" or self.lr is not None, "train.lr",
              f"is required by train.schedule={self.schedule}")
        check(self.schedule != "noam" or self.lr is None, "train.lr",
              "is not used by train.schedule=noam (the paper's Eq. 3, scaled by train.lr_scale): set train.schedule "
              "to inverse_sqrt, cosine, linear or constant, or leave train.lr out")

    def _check_fine_tuning(self) -> None:
        check(all(isinstance(p, str) and p for p in self.freeze), "train.freeze",
              f"must be a list of parameter name prefixes; got {list(self.freeze)}")
        check(self.head_lr is None or self.head_lr > 0, "train.head_lr", "must be positive")
        check(self.head_lr is None or self.schedule != "noam", "train.head_lr",
              "needs a schedule with a peak train.lr (not noam)")
        check(self.head_lr is None or not self.cuda_graphs, "train.head_lr",
              "cannot be combined with train.cuda_graphs")

    def _check_init(self) -> None:
        check(self.extend_vocab is None or self.extend_vocab > 0, "train.extend_vocab",
              f"must be a positive number of new pieces; got {self.extend_vocab}")
        check(self.extend_vocab is None or self.init_from is not None, "train.extend_vocab",
              "needs train.init_from: the model whose vocabulary it extends")

    def _check_speed(self) -> None:
        positive(self, "train", ("pad_multiple",))
        if self.cuda_graphs:
            check(self.grad_accum == 1, "train.cuda_graphs", f"needs train.grad_accum 1; got {self.grad_accum}")
            check(self.precision != "fp16", "train.cuda_graphs",
                  "needs train.precision fp32 or bf16 (fp16's loss scaler decides on the host)")
            check(not self.compile, "train.cuda_graphs", "cannot be combined with train.compile; choose one")
            check(not self.qat, "train.cuda_graphs", "cannot be combined with train.qat; choose one")
            check(self.optimizer != "adafactor", "train.cuda_graphs",
                  "needs train.optimizer adam or adamw (a fused step)")
        if self.fsdp:
            check(not self.cuda_graphs, "train.fsdp", "cannot be combined with train.cuda_graphs (a single process)")
            check(not self.compile, "train.fsdp", "cannot be combined with train.compile; choose one")
            check(self.precision != "fp16", "train.fsdp",
                  "needs train.precision fp32 or bf16 (bf16 needs no loss scaler)")
            check(not self.qat, "train.fsdp", "cannot be combined with train.qat (not tried together); choose one")
