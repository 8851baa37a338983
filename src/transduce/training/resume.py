"""A run's checkpoints: start from a trained model (``train.init_from``), write a checkpoint,
and resume from the newest intact one exactly (weights, optimizer, every rank's RNG, data
position and counters).

:class:`Checkpointing` is a part of :class:`~.loop.Trainer`; it uses the trainer's ``cfg``,
``run_dir``, ``data``, ``dist``, ``device``, ``model``, ``model_cfg``, ``optimizer``,
``scaler``, ``graphed``, ``ema``, ``state``, ``sharded`` (``train.fsdp`` on several ranks: the
checkpoint is gathered whole, see :mod:`.sharding`) and ``elapsed()``.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any

import torch

from ..data.tokenizer import load_tokenizer, tokenizer_exists
from ..errors import CheckpointError, ConfigError
from ..model.io import WEIGHTS, load_model_config, load_state_checked, read_weights, unique_state_dict
from .checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint, save_checkpoint
from ..config.quantize import QAT_FILE
from .ema import EMA_WEIGHTS
from .qat import observed_scales, restore_scales
from .distributed import all_gather_object, collective_failure, is_collective_error
from .sharding import full_model, full_optimizer_state, load_full_state, shard_optimizer_state
from .state import TrainingError, TrainState
from .step import load_optimizer_state
from .vocab import grow_vocab_rows

logger = logging.getLogger("transduce.training")

DROPOUTS = ("dropout", "attention_dropout", "activation_dropout")  # the model keys a fine-tuning run may change,
# ... which leading tokens local attention makes global (no weight depends on it)
GLOBALS = ("attention.global_tokens",)
VOCAB_SIZES = ("src_vocab_size", "tgt_vocab_size")  # ... and, with train.extend_vocab, these


def model_keys(cfg) -> dict:
    """A model config's keys and values, model.attention's as ``attention.KEY``."""
    keys = {f.name: getattr(cfg, f.name) for f in fields(cfg) if f.name != "attention"}
    return keys | {f"attention.{f.name}": getattr(cfg.attention, f.name) for f in fields(cfg.attention)}


def new_classifier_layer(state: dict[str, torch.Tensor], own: torch.nn.Module, directory: Path, saved,
                         cfg) -> dict[str, torch.Tensor]:
    """``state`` (a classifier's) with the last layer of its classification head replaced by
    ``own``'s, as initialised: the classes differ (``saved`` and ``cfg`` are the two model
    configs); a warning line names both."""
    def classes(c) -> str:
        names = ", ".join(c.labels[:6]) + (", ..." if len(c.labels) > 6 else "")
        return f"{c.n_classes} classes" + (f" ({names})" if names else "")

    logger.warning("train.init_from: %s is a classifier of %s; this run's %s get a new classification "
                   "layer (the encoder and pooler kept)", directory, classes(saved), classes(cfg))
    head = "cls_head.classifier."
    return {k: v for k, v in state.items() if not k.startswith(head)} | {
        k: v for k, v in unique_state_dict(own).items() if k.startswith(head)}


class Checkpointing:
    """The Trainer's checkpoint and resume methods."""

    @contextlib.contextmanager
    def collectives_guarded(self, step: int):
        """A failed collective inside (a rank gone: DDP's all-reduce, the logged loss's, a barrier,
        the checkpoint's gather) as a one-line TrainingError naming ``step``."""
        try:
            yield
        except RuntimeError as e:  # torch.distributed's errors (DistBackendError...) are RuntimeErrors
            if not (self.dist.enabled and is_collective_error(e)):
                raise
            raise TrainingError(collective_failure(self.dist, step, self.cfg.train.dist_timeout_s, e)) from None

    def init_from(self, directory: Path) -> None:
        """Start from a trained model's weights (``train.init_from``): the same model (every
        ``model`` key but the dropouts and ``global_tokens``: Longformer is fine-tuned with global
        tokens it was pretrained without), trained with the same tokenizer; a fresh optimizer. A
        classifier may start from a masked LM: its encoder and embeddings carried over, the
        masked-LM head dropped and the classification head as initialised here (but for the
        pooler of a next-sentence head, carried over as BERT's fine-tuning does). A classifier may
        start from a classifier of other classes (an imported BertForSequenceClassification, say):
        its encoder and pooler carried over, the last layer new, as transformers'
        ``ignore_mismatched_sizes=True``; a warning line says so."""
        saved = load_model_config(directory)
        new_head = saved.n_classes == 0 and self.model_cfg.n_classes > 0
        new_classes = 0 < saved.n_classes and 0 < self.model_cfg.n_classes and \
            (saved.n_classes, saved.labels) != (self.model_cfg.n_classes, self.model_cfg.labels)
        extend = self.cfg.train.extend_vocab is not None
        if saved.arch != self.model_cfg.arch:
            raise ConfigError(f"train.init_from: {directory} holds a model.arch={saved.arch} model; "
                              f"this run trains model.arch={self.model_cfg.arch}")
        self._check_init_tokenizer(directory, extend)
        free = (DROPOUTS + GLOBALS + (("n_classes", "labels", "nsp") if new_head else ())
                + (VOCAB_SIZES if extend else ()) + (("n_classes", "labels") if new_classes else ()))
        theirs, ours = model_keys(saved), model_keys(self.model_cfg)
        for key, value in theirs.items():
            if key not in free and value != ours[key]:
                raise ConfigError(f"train.init_from: {directory} has model.{key}={value}; this run's is {ours[key]}")
        state = read_weights(directory / WEIGHTS)
        # the rows and heads initialised here, read whole (gathered under train.fsdp)
        own = full_model(self.model, everywhere=True) if self.sharded and (extend or new_head or new_classes) \
            else self.model
        if extend:  # new rows for the new pieces; [MASK] stays the last id
            state = grow_vocab_rows(state, own, int(saved.family.masked_lm))
        if new_head:
            state = {k: v for k, v in state.items() if not k.startswith(("mlm_head.", "nsp_head."))} | {
                k: v for k, v in unique_state_dict(own).items() if k.startswith("cls_head.")} | {
                k.replace("nsp_head.", "cls_head."): v for k, v in state.items() if k.startswith("nsp_head.pooler.")}
        if new_classes:
            state = new_classifier_layer(state, own, directory, saved, self.model_cfg)
        (load_full_state if self.sharded else load_state_checked)(self.model, state, str(directory / WEIGHTS))
        if self.ema is not None:
            self.ema.reset()  # the average starts from the weights trained on
        logger.info("initialised from %s%s", directory, " (a new classification head)" if new_head else "")

    def _check_init_tokenizer(self, directory: Path, extend: bool) -> None:
        """The run's tokenizer must be the init model's, or with train.extend_vocab extend it."""
        init = load_tokenizer(directory) if tokenizer_exists(directory) else None
        if init is not None and extend and self.data.tokenizer.extends(init):
            return
        if init is None or init.digest() != self.data.tokenizer.digest():
            raise ConfigError(f"train.init_from: {directory}'s tokenizer is not the one {self.data.root} was "
                              f"prepared with (prepare with data.tokenizer={directory})")

    def restore_intact(self, ckpt_root: Path) -> Path:
        """:meth:`restore` from the newest checkpoint under ``ckpt_root`` that reads back intact
        (checksums, readable state): a damaged newer one is skipped, and the log says so."""
        latest = latest_checkpoint(ckpt_root)
        candidates = [latest] + [p for p in reversed(list_checkpoints(ckpt_root)) if p != latest]
        errors = []
        for path in candidates:
            try:
                loaded = load_checkpoint(path)
            except CheckpointError as e:
                errors.append(e)
                logger.warning("checkpoint %s is damaged (%s)", path.name, e)
                continue
            if errors:
                logger.warning("resuming from %s, the newest intact checkpoint", path.name)
            self.restore(path, loaded)
            return path
        raise CheckpointError(f"{ckpt_root}: no intact checkpoint to resume from ({errors[0]})")

    def restore(self, path: Path, loaded: tuple | None = None) -> None:
        """Continue from a checkpoint: weights, optimizer, RNG, data position and counters
        (``loaded``: what :func:`load_checkpoint` read from it, if done already)."""
        weights, trainer_state, info = loaded or load_checkpoint(path)
        if tokenizer_exists(path) and load_tokenizer(path).digest() != self.data.tokenizer.digest():
            raise CheckpointError(f"{path}: its tokenizer is not the one {self.data.root} was prepared with "
                                  "(resume with the data this run was trained on)")
        (load_full_state if self.sharded else load_state_checked)(self.model, weights, str(path))
        load_optimizer_state(self.optimizer, trainer_state["optimizer"])
        if self.sharded:
            shard_optimizer_state(self.optimizer)
        if self.graphed is not None:
            self.graphed.reset()  # new optimizer state tensors: graphs captured before would miss them
        rng = {"cpu": trainer_state["rng_cpu"], "cuda": trainer_state.get("rng_cuda")}  # rank 0's
        ranks = trainer_state.get("rng_ranks")  # every rank's, so each continues its own dropout stream
        if ranks is not None and len(ranks) == self.dist.world_size:
            rng = ranks[self.dist.rank]
        torch.set_rng_state(rng["cpu"])
        if rng.get("cuda") is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state(rng["cuda"])
        if self.scaler is not None and "scaler" in trainer_state:
            self.scaler.load_state_dict(trainer_state["scaler"])
        self.state = TrainState(**info["train_state"])
        self._restore_ema(path)
        if self.cfg.train.qat and (path / QAT_FILE).is_file():
            restore_scales(self.model, read_weights(path / QAT_FILE))  # the observers continue
        logger.info("resumed from %s (step %d, epoch %d)", path, self.state.step, self.state.epoch)

    def _restore_ema(self, path: Path) -> None:
        """The checkpoint's moving average of the weights (``train.ema_decay``); a checkpoint of a
        run without one starts it from the restored weights."""
        if self.ema is None:
            return
        if (path / EMA_WEIGHTS).is_file():
            self.ema.load_state_dict(read_weights(path / EMA_WEIGHTS))
            return
        logger.warning("%s has no %s (trained without train.ema_decay): the average starts here", path, EMA_WEIGHTS)
        self.ema.reset()

    def save(self) -> Path | None:
        """Write a checkpoint (rank 0 writes it; every rank calls this, giving its RNG state)."""
        self.data.verified()  # never a checkpoint of a run on damaged data (the check is long over by now)
        rng = {"cpu": torch.get_rng_state()}
        if self.device.type == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state(self.device)
        # Ranks draw different dropout masks (batches of different shapes), so their RNG
        # states differ: a resume restores each its own, to continue bitwise as if never stopped.
        with self.collectives_guarded(self.state.step):
            ranks = all_gather_object(self.dist, rng)
        model, optimizer, ema = self._whole_state()
        if model is None:
            return None
        trainer_state: dict[str, Any] = {"optimizer": optimizer, "rng_cpu": rng["cpu"], "rng_ranks": ranks}
        if self.device.type == "cuda":
            trainer_state["rng_cuda"] = rng["cuda"]
        if self.scaler is not None:
            trainer_state["scaler"] = self.scaler.state_dict()
        state = replace(self.state, elapsed=self.elapsed())
        info = {"train_state": asdict(state), "world_size": self.dist.world_size}
        return save_checkpoint(self.run_dir / "checkpoints", self.state.step, model, self.data.tokenizer,
                               trainer_state, info, self.cfg.train.keep_last, self.cfg.decode,
                               {**({EMA_WEIGHTS: ema} if ema is not None else {}), **self.qat_weights(model)})

    def qat_weights(self, model: torch.nn.Module | None) -> dict[str, dict[str, torch.Tensor]]:
        """With ``train.qat``: the file of ``model``'s observed input scales (:mod:`.qat`) to save
        beside its weights, for ``transduce quantize`` and a resume; else none."""
        scales = observed_scales(model) if self.cfg.train.qat and model is not None else {}
        return {QAT_FILE: scales} if scales else {}

    def _whole_state(self) -> tuple[torch.nn.Module | None, dict[str, Any] | None, dict[str, torch.Tensor] | None]:
        """The model, the optimizer's state and the weights' average (``train.ema_decay``, else
        None) as a checkpoint holds them, whole, on rank 0; the others get Nones. Every rank calls
        it: under ``train.fsdp`` they gather their shards."""
        if not self.sharded:
            if not self.dist.is_main:
                return None, None, None
            return self.model, self.optimizer.state_dict(), self.ema.state_dict(self.model) if self.ema else None
        ema = None
        if self.ema is not None:
            with self.ema.applied():
                averaged = self.whole_model()
            ema = unique_state_dict(averaged) if averaged is not None else None
        return self.whole_model(), full_optimizer_state(self.optimizer, self.dist.is_main), ema

    def whole_model(self) -> torch.nn.Module | None:
        """The model as a model directory holds it (unsharded) on rank 0, None on the others;
        every rank calls it (under ``train.fsdp`` they gather their shards)."""
        if self.sharded:
            return full_model(self.model)
        return self.model if self.dist.is_main else None

