"""The training loop: the paper's recipe (Sec. 5) by default, resumable exactly.

One run directory holds everything::

    RUN_DIR/config.yaml        the resolved run config
    RUN_DIR/prepared/          the prepared data (made once unless data.prepared names one)
    RUN_DIR/metrics.jsonl      one JSON object per log line / validation
    RUN_DIR/checkpoints/       step_XXXXXXXX/ (each a loadable model dir + training state), latest
    RUN_DIR/model/  best/      the final and the best model (by validation BLEU or accuracy, else loss)
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel

from ..config import RunConfig, save_yaml, with_vocab
from ..data.batch import Batch
from ..data.batching import BatchPlan, round_up, token_budget_batches
from ..data.corpus import sample_tokens
from ..data.encoder_inputs import TRAIN_STREAM, classification_batch, masked_batch, masking_generator
from ..data.prepare import prepared_for_run
from ..data.prepared import PreparedData, TokenPairs, length_dtype
from ..data.tokenizer import Tokenizer
from ..device import resolve_device
from ..errors import CheckpointError, ConfigError, TransduceError
from ..model.io import WEIGHTS, build_model, load_model_config, load_state_checked, read_weights, unique_state_dict
from .checkpoint import (average_checkpoints, latest_checkpoint, list_checkpoints, load_checkpoint,
                         save_checkpoint, save_model_dir)
from .distributed import (DistInfo, all_gather_object, barrier, collective_failure, init_distributed,
                          is_collective_error, shutdown_distributed)
from .graphs import GraphedStep
from .progress import Progress, TensorBoardLog
from .schedule import learning_rate
from .step import (build_optimizer, clip_and_step, compile_model, forward_backward, is_fused,
                   load_optimizer_state)
from .vocab import TOKENIZER_DIR, extend_run_vocabulary, grow_vocab_rows

logger = logging.getLogger("transduce.training")

DROPOUTS = ("dropout", "attention_dropout", "activation_dropout")  # the model keys a fine-tuning run may change
VOCAB_SIZES = ("src_vocab_size", "tgt_vocab_size")  # ... and, with train.extend_vocab, these


class TrainingError(TransduceError):
    """Training cannot continue (e.g. repeated non-finite losses)."""


@dataclass
class TrainState:
    """The counters a checkpoint's ``state.json`` stores besides weights and optimizer."""

    step: int = 0
    epoch: int = 0
    offset: int = 0            # plan batches of ``epoch`` already consumed, all ranks together
    tokens: int = 0            # target tokens (masked LM: selected tokens) trained on, all ranks together
    skipped_steps: int = 0     # steps skipped for non-finite loss or gradients
    bad_in_a_row: int = 0
    best: float | None = None  # best validation score (BLEU or accuracy, or -loss)
    evals_since_best: int = 0
    elapsed: float = 0.0       # seconds of training before this process started


@dataclass
class StepData:
    """One optimizer step's batches, made and copied to the device ahead of the step.

    ``start`` is the data position (epoch, offset) the step begins at and ``end`` the one after
    it: the TrainState moves to ``end`` only when the step is taken, so a checkpoint written
    while the next step's data waits here resumes exactly where the saved run stood.
    """

    start: tuple[int, int]
    end: tuple[int, int]
    batches: list[Batch]   # this rank's micro-batches, on the device
    tokens: int            # the loss normaliser: target (masked LM: selected) tokens of the step, all ranks


@dataclass
class EpochData:
    """One epoch's training pairs and its batch plan (batch ``i`` = ``plan[i]``, pair indices)."""

    epoch: int
    pairs: TokenPairs
    plan: BatchPlan


class Trainer:
    """Trains one model on prepared data; checkpoints and resumes exactly."""

    def __init__(self, cfg: RunConfig, run_dir: Path, data: PreparedData, dist: DistInfo, device: torch.device):
        self.cfg, self.run_dir, self.data, self.dist, self.device = cfg, run_dir, data, dist, device
        self.train_pairs, self.valid_pairs = data.split("train"), data.split("valid")
        self.valid_texts = data.texts("valid")
        if cfg.data.bpe_dropout > 0:
            data.text("train")  # a one-line error now if the data was prepared without it
        tok = data.tokenizer
        extra = 1 if cfg.model.arch == "encoder_only" else 0  # [MASK] is one id past the tokenizer's
        self.model_cfg = with_vocab(cfg.model, tok.src_vocab_size + extra, tok.tgt_vocab_size + extra)
        if cfg.task == "classify":
            self.model_cfg = replace(self.model_cfg, labels=self._labels(data.labels))
            if data.segments == 2 and cfg.model.type_vocab_size < 2:
                raise ConfigError(f"model.type_vocab_size: sentence pairs ({data.root}) need two token types, "
                                  f"as BERT's (2); got {cfg.model.type_vocab_size}")
        torch.manual_seed(cfg.train.seed)
        self.model = build_model(self.model_cfg).to(device)
        self.optimizer = build_optimizer(self.model, cfg.train)
        self.scaler = torch.amp.GradScaler("cuda") if cfg.train.precision == "fp16" else None
        # S and T padded up to a multiple: few distinct shapes for CUDA graphs (a compiled model
        # takes any shape; on Multi30k, multiples of 8 would cost eager steps ~20% more positions)
        self.pad_multiple = cfg.train.pad_multiple or (8 if cfg.train.cuda_graphs else 1)
        wrapped: torch.nn.Module = self.model
        if dist.enabled:
            if cfg.train.cuda_graphs:
                raise ConfigError(f"train.cuda_graphs: needs a single process; got world size {dist.world_size}")
            wrapped = DistributedDataParallel(self.model, device_ids=[device.index] if device.type == "cuda" else None)
        self.step_model = compile_model(wrapped) if cfg.train.compile else wrapped
        self.graphed = GraphedStep(self.model, self.optimizer, cfg.train, self.model_cfg.pad_id, device) \
            if cfg.train.cuda_graphs else None
        self._found_inf = torch.zeros((), device=device)  # the eager step's skip flag (fused optimizer)
        self._params = list(self.model.parameters())  # clipped every step (restore loads into them in place)
        self._ahead: StepData | None = None
        self._epoch: EpochData | None = None
        self.state = TrainState()
        self.metrics_path = run_dir / "metrics.jsonl"
        self.tensorboard = TensorBoardLog(run_dir / "tensorboard") if cfg.train.tensorboard and dist.is_main \
            else None
        self._last_eval: dict[str, float] | None = None
        self._t0 = time.monotonic()

    def _labels(self, labels: tuple[str, ...]) -> tuple[str, ...]:
        """The training data's classes, as many as ``model.n_classes`` says."""
        if len(labels) != self.cfg.model.n_classes:
            train = next((i["path"] for i in self.data.manifest["inputs"] if i["split"] == "train"), self.data.root)
            raise ConfigError(f"model.n_classes: {self.cfg.model.n_classes}, but {train} has {len(labels)} "
                              f"labels ({', '.join(labels[:10])})")
        return labels

    # ---- state ---------------------------------------------------------------------------------

    def init_from(self, directory: Path) -> None:
        """Start from a trained model's weights (``train.init_from``): the same model (every
        ``model`` key but the dropouts), trained with the same tokenizer; a fresh optimizer. A
        classifier may start from a masked LM: its encoder and embeddings carried over, the
        masked-LM head dropped and the classification head as initialised here."""
        saved = load_model_config(directory)
        new_head = saved.n_classes == 0 and self.model_cfg.n_classes > 0
        extend = self.cfg.train.extend_vocab is not None
        if saved.arch != self.model_cfg.arch:
            raise ConfigError(f"train.init_from: {directory} holds a model.arch={saved.arch} model; "
                              f"this run trains model.arch={self.model_cfg.arch}")
        self._check_init_tokenizer(directory, extend)
        free = DROPOUTS + (("n_classes", "labels") if new_head else ()) + (VOCAB_SIZES if extend else ())
        for f in fields(saved):
            if f.name not in free and getattr(saved, f.name) != getattr(self.model_cfg, f.name):
                raise ConfigError(f"train.init_from: {directory} has model.{f.name}={getattr(saved, f.name)}; "
                                  f"this run's is {getattr(self.model_cfg, f.name)}")
        state = read_weights(directory / WEIGHTS)
        if extend:  # new rows for the new pieces; [MASK] stays the last id
            state = grow_vocab_rows(state, self.model, 1 if saved.arch == "encoder_only" else 0)
        if new_head:
            state = {k: v for k, v in state.items() if not k.startswith("mlm_head.")}
            state.update({k: v for k, v in unique_state_dict(self.model).items() if k.startswith("cls_head.")})
        load_state_checked(self.model, state, str(directory / WEIGHTS))
        logger.info("initialised from %s%s", directory, " (a new classification head)" if new_head else "")

    def _check_init_tokenizer(self, directory: Path, extend: bool) -> None:
        """The run's tokenizer must be the init model's, or with train.extend_vocab extend it."""
        init = Tokenizer.load(directory) if Tokenizer.exists(directory) else None
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
        if Tokenizer.exists(path) and Tokenizer.load(path).digest() != self.data.tokenizer.digest():
            raise CheckpointError(f"{path}: its tokenizer is not the one {self.data.root} was prepared with "
                                  "(resume with the data this run was trained on)")
        load_state_checked(self.model, weights, str(path))
        load_optimizer_state(self.optimizer, trainer_state["optimizer"])
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
        logger.info("resumed from %s (step %d, epoch %d)", path, self.state.step, self.state.epoch)

    def save(self) -> Path | None:
        """Write a checkpoint (rank 0 writes it; every rank calls this, giving its RNG state)."""
        rng = {"cpu": torch.get_rng_state()}
        if self.device.type == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state(self.device)
        try:
            # Ranks draw different dropout masks (batches of different shapes), so their RNG
            # states differ: a resume restores each its own, to continue bitwise as if never stopped.
            ranks = all_gather_object(self.dist, rng)
        except RuntimeError as e:
            if not is_collective_error(e):
                raise
            raise TrainingError(collective_failure(self.dist, self.state.step, self.cfg.train.dist_timeout_s, e)) \
                from None
        if not self.dist.is_main:
            return None
        trainer_state: dict[str, Any] = {"optimizer": self.optimizer.state_dict(), "rng_cpu": rng["cpu"],
                                         "rng_ranks": ranks}
        if self.device.type == "cuda":
            trainer_state["rng_cuda"] = rng["cuda"]
        if self.scaler is not None:
            trainer_state["scaler"] = self.scaler.state_dict()
        state = replace(self.state, elapsed=self.elapsed())
        info = {"train_state": asdict(state), "world_size": self.dist.world_size}
        return save_checkpoint(self.run_dir / "checkpoints", self.state.step, self.model, self.data.tokenizer,
                               trainer_state, info, self.cfg.train.keep_last, self.cfg.decode)

    def elapsed(self) -> float:
        return self.state.elapsed + time.monotonic() - self._t0

    # ---- data ----------------------------------------------------------------------------------

    def epoch_data(self, epoch: int) -> EpochData:
        """The pairs and batch plan of ``epoch`` (a function of seed and epoch; the latest cached).

        With ``data.bpe_dropout`` the pairs are re-segmented for every epoch, so their lengths
        and hence the batches change from epoch to epoch.
        """
        if self._epoch is None or self._epoch.epoch != epoch:
            self._epoch = None  # let the previous epoch's arrays go before the next are built
            dc, pairs = self.cfg.data, self.train_pairs
            if dc.bpe_dropout > 0:
                pairs = self._resegmented(self.cfg.train.seed * 1_000_003 + epoch)
            multiple = self.pad_multiple if self.cfg.train.cuda_graphs else 1  # square buckets fit the budget
            plan = token_budget_batches(*pairs.task_lengths(self.cfg.task), dc.max_tokens, self.cfg.train.seed,
                                        epoch, multiple=multiple)
            self._epoch = EpochData(epoch, pairs, plan)
        return self._epoch

    def _resegmented(self, seed: int, chunk: int = 8192) -> TokenPairs:
        """One BPE-dropout segmentation of the training pairs, their text read from disk in chunks."""
        dc, text, usual = self.cfg.data, self.data.text("train"), self.train_pairs
        rows: tuple[list, list] = ([], [])
        for lo in range(0, len(usual), chunk):
            idx = range(lo, min(lo + chunk, len(usual)))
            sampled = sample_tokens(text.pairs(lo, idx.stop), (usual.rows(0, idx), usual.rows(1, idx)),
                                    self.data.tokenizer, dc.bpe_dropout, dc.bpe_dropout_sides,
                                    seed=seed * 7919 + lo, max_len=self.data.max_len)
            rows[0].extend(sampled[0])
            rows[1].extend(sampled[1])
        text.release()
        return TokenPairs.from_rows(rows[0], rows[1], self.data.dtype, length_dtype(self.data.max_len))

    def step_data(self) -> StepData:
        """The next optimizer step's batches (prefetched by the previous step if it could), and
        the data position moved past them."""
        start = (self.state.epoch, self.state.offset)
        data = self._ahead if self._ahead is not None and self._ahead.start == start else self._make_step_data(*start)
        self._ahead = None
        self.state.epoch, self.state.offset = data.end
        return data

    def _make_step_data(self, epoch: int, offset: int) -> StepData:
        """The plan batches of the step at (epoch, offset): grad_accum per rank, all ranks together.

        The position is counted in plan batches, so a run can resume on another world size. The
        tail of an epoch too short for a whole step is skipped. Nothing in the TrainState moves.
        """
        need = self.cfg.train.grad_accum * self.dist.world_size
        plan = self.epoch_data(epoch).plan
        if len(plan) < need:
            raise ConfigError(f"data.max_tokens: an epoch has only {len(plan)} batches, fewer than one step "
                              f"needs ({need} = grad_accum x world size)")
        start = (epoch, offset)
        if offset + need > len(plan):
            epoch, offset = epoch + 1, 0
        data = self.epoch_data(epoch)
        group = [data.plan[i] for i in range(offset, offset + need)]
        if self.cfg.task == "classify":
            tokens = sum(len(b) for b in group)  # the loss is per sentence
            batches = [self._device_batch(classification_batch(data.pairs.batch(b)))
                       for b in group[self.dist.rank::self.dist.world_size]]
        elif self.cfg.task == "mlm":  # every rank masks the whole step: the normaliser counts all its selected tokens
            masked = [masked_batch(data.pairs.batch(b), self.model.mask_id,
                                   masking_generator(self.cfg.train.seed, TRAIN_STREAM, epoch, offset + j))
                      for j, b in enumerate(group)]
            tokens = sum(b.n_tgt_tokens for b in masked)
            batches = [self._device_batch(b) for b in masked[self.dist.rank::self.dist.world_size]]
        else:
            tokens = sum(int(data.pairs.tgt_lens[b].sum()) + len(b) for b in group)
            batches = [self._device_batch(data.pairs.batch(b)) for b in group[self.dist.rank::self.dist.world_size]]
        data.pairs.release()  # the ids are copied: their pages need not stay in this process
        return StepData(start, (epoch, offset + need), batches, tokens)

    def _device_batch(self, batch: Batch) -> Batch:
        """``batch`` padded to its shape bucket, on the device (through pinned memory on CUDA: the
        copy is asynchronous, queued behind the work already on the GPU)."""
        m, s, t = self.pad_multiple, batch.src.size(1), batch.tgt_in.size(1)
        if self.cfg.train.cuda_graphs:  # (max_tokens // L, L) for both sides: one graph per bucket L
            width = round_up(max(s, t), m)
            batch = batch.padded(self.cfg.data.max_tokens // width, width, width)
        elif m > 1:
            batch = batch.padded(len(batch), round_up(s, m), round_up(t, m))
        if self.device.type == "cuda":
            batch = batch.pin_memory()
        return batch.to(self.device)

    # ---- one step ------------------------------------------------------------------------------

    def train_step(self) -> dict[str, float] | None:
        """One optimizer step; returns its metrics, or None if it was skipped as non-finite.

        The step's work is queued on the device, then the next step's batches are made and
        queued behind it (the host works while the device computes), and only then is the one
        value of the step read back: loss, NLL, gradient norm and whether the update applied.
        """
        cfg = self.cfg.train
        data = self.step_data()
        lr = learning_rate(self.state.step + 1, cfg, self.model_cfg.d_model, self._total_steps())
        self.step_model.train()
        if self.graphed is not None:
            metrics, pending = self.graphed(data.batches[0], lr, data.tokens), False
        else:
            metrics, pending = self._queue_step(data, lr)
        if self.state.step + 1 < cfg.max_steps:
            self._ahead = self._make_step_data(self.state.epoch, self.state.offset)
        loss, nll, grad_norm, applied = metrics.tolist()  # the step's one host synchronisation
        if pending and applied:
            if self.scaler is not None:
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                self.optimizer.step()
        if self.graphed is None:
            self.optimizer.zero_grad(set_to_none=True)
        self.state.step += 1
        self.state.tokens += data.tokens
        if not applied:
            return self._bad_step(loss, grad_norm)
        self.state.bad_in_a_row = 0
        n = sum(b.n_tgt_tokens for b in data.batches)
        return {"loss": loss / max(n, 1), "nll": nll / max(n, 1), "lr": lr, "grad_norm": grad_norm}

    def _queue_step(self, data: StepData, lr: float) -> tuple[Tensor, bool]:
        """Forward, backward and clipping of one step, queued without a host sync.

        With a fused optimizer (CUDA) the update is queued too, skipped on the device if the step
        is non-finite; otherwise (foreach on CPU, fp16's GradScaler) it waits for the caller's
        host read of the metrics. Returns the (4,) metrics tensor (loss sum, NLL sum, gradient
        norm, applied) and whether the update is still pending.
        """
        cfg = self.cfg.train
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        sums = forward_backward(self.step_model, data.batches, cfg.label_smoothing, self.model_cfg.pad_id,
                                max(data.tokens, 1) / self.dist.world_size, cfg.precision, self.device, self.scaler)
        params = self._params
        if self.scaler is None and is_fused(self.optimizer):
            norm, ok = clip_and_step(self.optimizer, params, sums[0], cfg.clip_norm, self._found_inf)
            return torch.cat([sums, norm.reshape(1), ok.reshape(1).float()]), False
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        norm = torch.nn.utils.clip_grad_norm_(params, cfg.clip_norm or math.inf, foreach=True)
        ok = torch.isfinite(sums[0])
        if self.scaler is None:  # with a scaler, non-finite gradients are its business (it skips and rescales)
            ok &= torch.isfinite(norm)
        return torch.cat([sums, norm.reshape(1), ok.reshape(1).float()]), True

    def _bad_step(self, loss: float, grad_norm: float) -> None:
        self.state.skipped_steps += 1
        self.state.bad_in_a_row += 1
        logger.warning("step %d skipped: non-finite loss %s or gradient norm %s", self.state.step, loss, grad_norm)
        if self.state.bad_in_a_row > self.cfg.train.max_bad_steps:
            raise TrainingError(f"{self.state.bad_in_a_row} steps in a row had non-finite loss or gradients; "
                                "stopping without saving (lower the learning rate or use fp32)")
        return None

    def _total_steps(self) -> int:
        """End of the decay schedules: max_steps, or fewer if a time budget will end sooner."""
        cfg = self.cfg.train
        if cfg.max_minutes is None or self.state.step < 20:
            return cfg.max_steps
        per_step = self.elapsed() / self.state.step
        return max(1, min(cfg.max_steps, int(cfg.max_minutes * 60 / per_step)))

    # ---- validation ----------------------------------------------------------------------------

    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        """Validation loss/perplexity and, for translation, (greedy) BLEU on the validation split; a
        classifier's loss and accuracy."""
        from .validation import validation_bleu, validation_classify, validation_loss
        self.model.eval()
        out: dict[str, float] = {}
        if len(self.valid_pairs) and self.cfg.task == "classify":
            out.update(validation_classify(self.model, self.valid_pairs, self.cfg, self.device))
        elif len(self.valid_pairs):
            loss, nll = validation_loss(self.model, self.valid_pairs, self.cfg, self.device)
            out.update(val_loss=loss, val_ppl=math.exp(min(nll, 50.0)))
        if self.cfg.train.eval_bleu and self.valid_texts and self.cfg.task == "translation":
            out["val_bleu"] = validation_bleu(self.model, self.data.tokenizer, self.valid_texts, self.cfg, self.device)
        return out

    def _improved(self, metrics: dict[str, float]) -> bool:
        score = metrics.get("val_bleu", metrics.get("val_acc", -metrics.get("val_loss", math.inf)))
        if self.state.best is None or score > self.state.best:
            self.state.best, self.state.evals_since_best = score, 0
            return True
        self.state.evals_since_best += 1
        return False

    # ---- the loop ------------------------------------------------------------------------------

    def log(self, record: dict[str, Any]) -> None:
        if self.dist.is_main:
            with open(self.metrics_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
            if self.tensorboard is not None:
                self.tensorboard.write(record)

    def _should_stop(self) -> str | None:
        cfg = self.cfg.train
        if self.state.step >= cfg.max_steps:
            return "max_steps"
        if cfg.max_epochs is not None and self.state.epoch >= cfg.max_epochs:
            return "max_epochs"
        if cfg.max_minutes is not None and self.elapsed() >= cfg.max_minutes * 60:
            return "max_minutes"
        if cfg.patience is not None and self.state.evals_since_best >= cfg.patience:
            return "early stopping"
        return None

    def train(self) -> str:
        """Train until a stop condition; returns which one."""
        cfg = self.cfg.train
        progress = Progress(cfg.max_steps, enabled=self.dist.is_main)
        window_tokens, window_t0 = 0, time.monotonic()
        while (reason := self._should_stop()) is None:
            tokens_before = self.state.tokens
            try:
                metrics = self.train_step()
            except RuntimeError as e:  # torch.distributed's errors (DistBackendError...) are RuntimeErrors
                if not (self.dist.enabled and is_collective_error(e)):
                    raise
                raise TrainingError(collective_failure(self.dist, self.state.step + 1, cfg.dist_timeout_s, e)) \
                    from None
            window_tokens += self.state.tokens - tokens_before
            step = self.state.step
            if metrics is not None and (step % cfg.log_every == 0 or step == 1):
                now = time.monotonic()
                record = {"step": step, "epoch": self.state.epoch, "loss": metrics["loss"],
                          "ppl": math.exp(min(metrics["nll"], 50.0)), "lr": metrics["lr"],
                          "tokens_per_s": window_tokens / max(now - window_t0, 1e-9),
                          "grad_norm": metrics["grad_norm"], "elapsed": self.elapsed()}
                self.log(record)
                progress.update(step, {k: record[k] for k in ("loss", "lr", "tokens_per_s")}, force=True)
                window_tokens, window_t0 = 0, now
            if step % cfg.eval_every == 0:
                self._evaluate_and_keep_best(progress)
            if step % cfg.save_every == 0:
                self.save()
        progress.close()
        return reason

    def _evaluate_and_keep_best(self, progress: Progress) -> dict[str, float]:
        metrics = self.validate()
        self._last_eval = {"step": self.state.step, **metrics}
        self.log({"step": self.state.step, "elapsed": self.elapsed(), **metrics})
        progress.message(f"step {self.state.step}: " + ", ".join(f"{k} {v:.4g}" for k, v in metrics.items()))
        if self._improved(metrics) and self.dist.is_main:
            save_model_dir(self.model, self.data.tokenizer, self.run_dir / "best", self.cfg.decode)
        return metrics

    def finish(self, reason: str) -> dict[str, float]:
        """Final validation, checkpoint, and the ``model/`` directory (averaged if configured)."""
        metrics = self._last_eval
        if metrics is None or metrics.get("step") != self.state.step:
            metrics = self._evaluate_and_keep_best(Progress(0, enabled=self.dist.is_main))
        if self.state.step % self.cfg.train.save_every:
            self.save()
        if self.dist.is_main:
            k = self.cfg.train.average_last
            ckpts = list_checkpoints(self.run_dir / "checkpoints")[-k:] if k else []
            if len(ckpts) > 1:
                average_checkpoints(ckpts, self.run_dir / "model")
            else:
                save_model_dir(self.model, self.data.tokenizer, self.run_dir / "model", self.cfg.decode)
            logger.info("stopped (%s) at step %d after %.0f s; model in %s", reason, self.state.step,
                        self.elapsed(), self.run_dir / "model")
        if self.tensorboard is not None:
            self.tensorboard.close()
        return metrics


def _run_data(cfg: RunConfig, run_dir: Path) -> PreparedData:
    """The prepared data of ``cfg.data``: a classification set for train.task classify, else text pairs."""
    data = prepared_for_run(cfg.data, run_dir, cfg.train.seed)
    if bool(data.labels) != (cfg.task == "classify"):
        held = "a classification set (text<TAB>label)" if data.labels else "text, no labels"
        raise ConfigError(f"data.prepared: {data.root} holds {held}; train.task {cfg.task} needs "
                          + ("a classification set" if cfg.task == "classify" else "text"))
    return data


def run_training(cfg: RunConfig, run_dir: Path, resume: bool = False) -> tuple[Trainer, dict[str, float]]:
    """Prepare data, build or restore the trainer, train, and write the final model."""
    device = resolve_device(cfg.train.device, "train.device")
    dist = init_distributed(device.type, cfg.train.dist_timeout_s)
    if dist.enabled and device.type == "cuda":
        device = torch.device("cuda", dist.local_rank)
    try:
        if cfg.train.num_threads:
            torch.set_num_threads(cfg.train.num_threads)
        latest = latest_checkpoint(run_dir / "checkpoints")
        if latest is not None and not resume:
            raise ConfigError(f"--out: {run_dir} already holds checkpoints; pass --resume to continue "
                              "or choose a new --out")
        if cfg.train.extend_vocab is not None and dist.is_main:
            cfg = extend_run_vocabulary(cfg, run_dir)
        elif cfg.train.extend_vocab is not None:  # made by rank 0 before the barrier below
            cfg = replace(cfg, data=replace(cfg.data, tokenizer=str(run_dir / TOKENIZER_DIR)))
        cfg = cfg.with_init_tokenizer()
        if dist.is_main:
            run_dir.mkdir(parents=True, exist_ok=True)
            save_yaml(cfg.to_dict(), run_dir / "config.yaml")
            data = _run_data(cfg, run_dir)
        barrier(dist)
        if not dist.is_main:
            data = _run_data(cfg, run_dir)
        trainer = Trainer(cfg, run_dir, data, dist, device)
        if resume and latest is not None:
            trainer.restore_intact(run_dir / "checkpoints")
        elif cfg.train.init_from is not None:
            trainer.init_from(Path(cfg.train.init_from))
        reason = trainer.train()
        metrics = trainer.finish(reason)
        return trainer, metrics
    finally:
        shutdown_distributed()
