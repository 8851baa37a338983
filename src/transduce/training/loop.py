"""The training loop: the paper's recipe (Sec. 5) by default, resumable exactly.

One run directory holds everything::

    RUN_DIR/config.yaml        the resolved run config
    RUN_DIR/prepared/          the prepared data (made once unless data.prepared names one)
    RUN_DIR/metrics.jsonl      one JSON object per log line / validation
    RUN_DIR/checkpoints/       step_XXXXXXXX/ (each a loadable model dir + training state), latest
    RUN_DIR/model/  best/      the final and the best model (by validation BLEU or accuracy, else loss)

The loop's parts live beside it: the step's batches (:mod:`.feed`), checkpoints and resuming
(:mod:`.resume`), the metrics records and the step's figures (:mod:`.report`), the counters
(:mod:`.state`), the forward/backward and optimizer (:mod:`.step`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from dataclasses import replace
from pathlib import Path

import torch
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel

from ..config import RunConfig, save_yaml, with_vocab
from ..data.prepare import RUN_SUBDIR, input_path, prepared_for_run
from ..data.prepared import PreparedData
from ..data.span_corruption import span_sentinels
from ..device import resolve_device
from ..errors import ConfigError
from ..model.io import WEIGHTS, build_model
from ..progress import progress_bar
from ..tracing import DATA, scope
from .preemption import PREEMPTED, sigterm_flag
from .checkpoint import average_checkpoints, latest_checkpoint, list_checkpoints, save_model_dir
from .ema import EMA_WEIGHTS, WeightEMA
from .distributed import DistInfo, all_reduce_sum, barrier, init_distributed, shutdown_distributed
from .feed import StepFeed
from .guided import guided_setup
from .cuda_graphs import GraphedStep
from .report import MetricsLog
from .resume import Checkpointing
from .schedule import learning_rate
from .sharding import full_model, full_value, shard_model
from .state import StepData, TrainingError, TrainState
from .dropout import use_cpu_dropout
from .qat import average_observers, prepare_qat
from .step import build_optimizer, clip_and_step, compile_model, forward_backward, freeze_parameters, is_fused
from .validation import validation_bleu, validation_classify, validation_loss
from .vocab import TOKENIZER_DIR, extend_run_vocabulary

__all__ = ["Trainer", "TrainingError", "run_training"]  # TrainingError lives in .state; importable from here too

logger = logging.getLogger("transduce.training")


class Trainer(Checkpointing):
    """Trains one model on prepared data; checkpoints and resumes exactly (:class:`.resume.Checkpointing`)."""

    def __init__(self, cfg: RunConfig, run_dir: Path, data: PreparedData, dist: DistInfo, device: torch.device):
        self.run_dir, self.data, self.dist, self.device = run_dir, data, dist, device
        n_valid = cfg.data.valid_max_sentences  # taken now, from the prepared split: no new prepare
        self.valid_pairs = data.split("valid").head(n_valid)
        self.valid_texts = data.texts("valid")[:n_valid]
        if cfg.data.bpe_dropout > 0:
            data.text("train")  # a one-line error now if the data was prepared without it
        tok = data.tokenizer
        # [MASK] is the model's last id: one past the tokenizer's, unless the tokenizer has it (an import's)
        extra = 1 if cfg.model.family.masked_lm and tok.mask_id is None else 0
        self.model_cfg = with_vocab(cfg.model, tok.src_vocab_size + extra, tok.tgt_vocab_size + extra)
        self.cfg, guided = guided_setup(cfg, data, self.model_cfg)  # its decode settings name the guided head
        self.guided = None if guided is None else (cfg.train.guided_alignment_weight, guided)
        if cfg.task_spec.labelled:
            self.model_cfg = replace(self.model_cfg, labels=self._labels(data.labels))
            if data.segments == 2 and cfg.model.type_vocab_size < 2:
                raise ConfigError(f"model.type_vocab_size: sentence pairs ({data.root}) need two token types, "
                                  f"as BERT's (2); got {cfg.model.type_vocab_size}")
        torch.manual_seed(cfg.train.seed)
        self.model = build_model(self.model_cfg).to(device)
        freeze_parameters(self.model, cfg.train.freeze)
        if device.type == "cpu":
            use_cpu_dropout(self.model)  # PyTorch's CPU dropout mask is a large share of a small model's step
        if cfg.train.qat:
            prepare_qat(self.model)
        self.sharded = cfg.train.fsdp and dist.enabled  # one process: nothing to shard
        if self.sharded:
            shard_model(self.model, cfg.train.precision)  # before the optimizer: it holds the shards
        self.optimizer = build_optimizer(self.model, cfg.train)
        self.scaler = torch.amp.GradScaler("cuda") if cfg.train.precision == "fp16" else None
        # S and T padded up to a multiple: few distinct shapes for CUDA graphs (a compiled model
        # takes any shape; on Multi30k, multiples of 8 would cost eager steps ~20% more positions)
        self.pad_multiple = cfg.train.pad_multiple or (8 if cfg.train.cuda_graphs else 1)
        wrapped: torch.nn.Module = self.model
        if dist.enabled and cfg.train.cuda_graphs:
            raise ConfigError(f"train.cuda_graphs: needs a single process; got world size {dist.world_size}")
        if dist.enabled and not self.sharded:
            wrapped = DistributedDataParallel(self.model, device_ids=[device.index] if device.type == "cuda" else None)
        self.step_model = compile_model(wrapped) if cfg.train.compile else wrapped
        self.sentinels = span_sentinels(tok, data.split("train").src_lens, self.valid_pairs.src_lens) \
            if cfg.task_spec.spans else ()
        self.feed = StepFeed(cfg, data, dist, device, self.pad_multiple,
                             self.model.mask_id if cfg.task_spec.masked else None, self.sentinels)
        self.graphed = GraphedStep(self.model, self.optimizer, cfg.train, self.model_cfg.label_pad_id, device) \
            if cfg.train.cuda_graphs else None
        self._found_inf = torch.zeros((), device=device)  # the eager step's skip flag (fused optimizer)
        self._params = list(self.model.parameters())  # clipped every step (restore loads into them in place)
        self.ema = WeightEMA(self.model, cfg.train.ema_decay) if cfg.train.ema_decay else None
        self._ahead: StepData | None = None
        self.state = TrainState()
        self.metrics = MetricsLog(run_dir, dist.is_main, cfg.train.tensorboard)
        self._last_eval: dict[str, float] | None = None
        self._t0 = time.monotonic()

    def _labels(self, labels: tuple[str, ...]) -> tuple[str, ...]:
        """The training data's classes, as many as ``model.n_classes`` says."""
        if len(labels) != self.cfg.model.n_classes:
            train = next((input_path(self.data.root, i) for i in self.data.manifest["inputs"] if i["split"] == "train"),
                         self.data.root)
            raise ConfigError(f"model.n_classes: {self.cfg.model.n_classes}, but {train} has {len(labels)} "
                              f"labels ({', '.join(labels[:10])})")
        return labels

    def elapsed(self) -> float:
        return self.state.elapsed + time.monotonic() - self._t0

    def step_data(self) -> StepData:
        """The next optimizer step's batches (prefetched by the previous step if it could), and
        the data position moved past them."""
        start = (self.state.epoch, self.state.offset)
        if self._ahead is not None and self._ahead.start == start:
            data = self._ahead
        else:
            with scope(DATA):
                data = self.feed.step_data(*start)
        self._ahead = None
        self.state.epoch, self.state.offset = data.end
        return data

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
            with scope(DATA):
                self._ahead = self.feed.step_data(self.state.epoch, self.state.offset)
        loss, nll, grad_norm, applied = metrics.tolist()  # the step's one host synchronisation
        if pending and applied:
            if self.scaler is not None:
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                self.optimizer.step()
        if self.graphed is None:
            self.optimizer.zero_grad(set_to_none=True)
        if cfg.qat and self.dist.enabled:
            average_observers(self.model)  # each rank observed its own batches (transduce.training.qat)
        if self.ema is not None and applied:
            self.ema.update(self.state.step - self.state.skipped_steps)  # updates before this one
        self.state.step += 1
        self.state.tokens += data.tokens
        if not applied:
            return self._bad_step(loss, grad_norm)
        self.state.bad_in_a_row = 0
        n = sum(b.n_tgt_tokens for b in data.batches)
        return {"loss": loss / max(n, 1), "nll": nll / max(n, 1), "lr": lr, "grad_norm": grad_norm, "tokens": n}

    def _queue_step(self, data: StepData, lr: float) -> tuple[Tensor, bool]:
        """Forward, backward and clipping of one step, queued without a host sync.

        With a fused optimizer (CUDA) the update is queued too, skipped on the device if the step
        is non-finite; otherwise (foreach on CPU, fp16's GradScaler) it waits for the caller's
        host read of the metrics. Returns the (4,) metrics tensor (loss sum, NLL sum, gradient
        norm, applied) and whether the update is still pending.
        """
        cfg = self.cfg.train
        for g in self.optimizer.param_groups:
            g["lr"] = lr * g.get("lr_ratio", 1.0)  # train.head_lr's groups: their share of the schedule
        sums = forward_backward(self.step_model, data.batches, cfg.label_smoothing, self.model_cfg.label_pad_id,
                                max(data.tokens, 1) / self.dist.world_size, cfg.precision, self.device, self.scaler,
                                guided=self.guided)
        params = self._params
        if self.scaler is None and is_fused(self.optimizer):
            norm, ok = clip_and_step(self.optimizer, params, sums[0], cfg.clip_norm, self._found_inf)
            return torch.cat([sums, norm.reshape(1), ok.reshape(1).float()]), False
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        norm = full_value(torch.nn.utils.clip_grad_norm_(params, cfg.clip_norm or math.inf, foreach=True))
        ok = torch.isfinite(sums[0])
        if self.scaler is None:  # with a scaler, non-finite gradients are its business (it skips and rescales)
            ok &= torch.isfinite(norm)
        return torch.cat([sums, norm.reshape(1), ok.reshape(1).float()]), True

    def _bad_step(self, loss: float, grad_norm: float) -> None:
        self.state.skipped_steps += 1
        self.state.bad_in_a_row += 1
        logger.warning("step %d skipped: non-finite loss %s or gradient norm %s", self.state.step, loss, grad_norm)
        if self.state.bad_in_a_row > self.cfg.train.max_bad_steps:
            first = self.state.step + 1 - self.state.bad_in_a_row
            raise TrainingError(f"steps {first}-{self.state.step} ({self.state.bad_in_a_row} in a row) had non-finite "
                                f"loss or gradients ({self.cfg.train.precision}); stopping without saving: the last "
                                "checkpoint and best/ hold finite weights (lower the learning rate or use fp32)")
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
        """Validation loss/perplexity and, for translation, (greedy) BLEU on the validation split
        (text-to-text data: each task's BLEU or accuracy); a classifier's loss and accuracy."""
        with self.averaged():
            return self._validate()

    def _validate(self) -> dict[str, float]:
        model = full_model(self.model, everywhere=True) if self.sharded else self.model  # every rank validates
        model.eval()
        out: dict[str, float] = {}
        if len(self.valid_pairs) and self.cfg.task_spec.labelled:
            out.update(validation_classify(model, self.valid_pairs, self.cfg, self.device))
        elif len(self.valid_pairs):
            loss, nll = validation_loss(model, self.valid_pairs, self.cfg, self.device, self.sentinels)
            out.update(val_loss=loss, val_ppl=math.exp(min(nll, 50.0)))
        if self.cfg.train.eval_bleu and self.valid_texts and self.cfg.task_spec.translates:
            out.update(validation_bleu(model, self.data.tokenizer, self.valid_texts, self.cfg, self.device))
        return out

    def averaged(self) -> contextlib.AbstractContextManager:
        """A block in which the model holds the moving average of its weights (``train.ema_decay``),
        or its own weights when there is none."""
        return self.ema.applied() if self.ema is not None else contextlib.nullcontext()

    def _improved(self, metrics: dict[str, float]) -> bool:
        score = metrics.get("val_bleu", metrics.get("val_acc", -metrics.get("val_loss", math.inf)))
        if not math.isfinite(score):  # a diverged model is never kept as the best one
            logger.warning("step %d: validation score %s is not finite; best/ is left as it was",
                           self.state.step, score)
            self.state.evals_since_best += 1
            return False
        if self.state.best is None or score > self.state.best:
            self.state.best, self.state.evals_since_best = score, 0
            return True
        self.state.evals_since_best += 1
        return False

    # ---- the loop ------------------------------------------------------------------------------

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
        # Ranks would see a SIGTERM at different steps, and a checkpoint is a collective: distributed
        # runs keep the default (the process ends; resume from the last periodic checkpoint).
        with sigterm_flag(enabled=not self.dist.enabled) as preempted, \
                progress_bar(cfg.max_steps, unit="steps", desc="training", initial=self.state.step,
                             enabled=self.dist.is_main) as bar:
            window_tokens, window_t0 = 0, time.monotonic()
            while (reason := PREEMPTED if preempted.is_set() else self._should_stop()) is None:
                tokens_before = self.state.tokens
                # every collective of the step (DDP's, logging's, eval's, save's) as a one-line error
                with self.collectives_guarded(self.state.step + 1):
                    metrics = self.train_step()
                    window_tokens += self.state.tokens - tokens_before
                    step = self.state.step
                    bar.update(step - bar.n)
                    if metrics is not None and (step % cfg.log_every == 0 or step == 1):
                        now = time.monotonic()
                        record = self._step_record(metrics, window_tokens / max(now - window_t0, 1e-9))
                        self.metrics.write_step(record, bar, cfg.max_steps)
                        window_tokens, window_t0 = 0, now
                    if step % cfg.eval_every == 0:
                        self._evaluate_and_keep_best()
                    if step % cfg.save_every == 0:
                        self.save()
        return reason

    def _step_record(self, metrics: dict[str, float], tokens_per_s: float) -> dict[str, float]:
        """The logged record of a step from :meth:`train_step`'s ``metrics`` (this rank's batches):
        its loss and perplexity per token over every rank's batches, one all-reduce of three numbers
        on the logged steps only (every rank logs the same steps). The gradient norm is global
        already (taken after the ranks' gradients are reduced), and so are the step's tokens."""
        n = metrics["tokens"]
        loss, nll, n = all_reduce_sum(self.dist, [metrics["loss"] * n, metrics["nll"] * n, n], self.device)
        loss, nll = loss / max(n, 1), nll / max(n, 1)
        return {"step": self.state.step, "epoch": self.state.epoch, "loss": loss, "ppl": math.exp(min(nll, 50.0)),
                "lr": metrics["lr"], "tokens_per_s": tokens_per_s, "grad_norm": metrics["grad_norm"],
                "elapsed": self.elapsed()}

    def _evaluate_and_keep_best(self) -> dict[str, float]:
        metrics = self.validate()
        self._last_eval = {"step": self.state.step, **metrics}
        self.metrics.write({"step": self.state.step, "elapsed": self.elapsed(), **metrics})
        if self.dist.is_main:  # above the bar while one is drawn (transduce.progress)
            logger.info("step %d: %s", self.state.step, ", ".join(f"{k} {v:.4g}" for k, v in metrics.items()))
        if self._improved(metrics):
            with self.averaged():
                if (model := self.whole_model()) is not None:
                    save_model_dir(model, self.data.tokenizer, self.run_dir / "best", self.cfg.decode,
                                   self.qat_weights(model))
        return metrics

    def preempted(self) -> dict[str, float]:
        """After a SIGTERM: a checkpoint of this step (no final validation, no ``model/``: the run
        is not over), so that ``--resume`` continues exactly."""
        if self.state.step and self.state.step % self.cfg.train.save_every:
            self.save()
        logger.warning("%s at step %d: checkpoint saved; continue with --resume", PREEMPTED, self.state.step)
        self.metrics.close()
        return {}

    def finish(self, reason: str) -> dict[str, float]:
        """Final validation, checkpoint, and the ``model/`` directory (averaged if configured)."""
        metrics = self._last_eval
        if metrics is None or metrics.get("step") != self.state.step:
            metrics = self._evaluate_and_keep_best()
        if self.state.step % self.cfg.train.save_every:
            self.save()
        with self.averaged():
            model = self.whole_model()  # every rank gathers under train.fsdp, rank 0 writes
            k = self.cfg.train.average_last
            ckpts = list_checkpoints(self.run_dir / "checkpoints")[-k:] if k and model is not None else []
            if len(ckpts) > 1:
                ema = self.ema is not None and all((c / EMA_WEIGHTS).is_file() for c in ckpts)
                average_checkpoints(ckpts, self.run_dir / "model", EMA_WEIGHTS if ema else WEIGHTS)
            elif model is not None:
                save_model_dir(model, self.data.tokenizer, self.run_dir / "model", self.cfg.decode,
                               self.qat_weights(model))
        if self.dist.is_main:
            logger.info("stopped (%s) at step %d after %.0f s; model in %s", reason, self.state.step,
                        self.elapsed(), self.run_dir / "model")
        self.metrics.close()
        return metrics


def run_data(cfg: RunConfig, run_dir: Path) -> PreparedData:
    """The prepared data of ``cfg.data``: a classification set for train.task classify, else text pairs."""
    data = prepared_for_run(cfg.data, run_dir, cfg.train.seed)
    if bool(data.labels) != cfg.task_spec.labelled:
        held = "a classification set (text<TAB>label)" if data.labels else "text, no labels"
        raise ConfigError(f"data.prepared: {data.root} holds {held}; train.task {cfg.task} needs "
                          + ("a classification set" if cfg.task_spec.labelled else "text"))
    return data


def run_training(cfg: RunConfig, run_dir: Path, resume: bool = False) -> tuple[Trainer, dict[str, float]]:
    """Prepare data, build or restore the trainer, train, and write the final model."""
    device = resolve_device(cfg.train.device, "train.device")
    dist = init_distributed(device.type, cfg.train.dist_timeout_s)
    if dist.enabled and device.type == "cuda":
        device = torch.device("cuda", dist.local_rank)
    try:
        if cfg.train.threads:
            torch.set_num_threads(cfg.train.threads)
        latest = latest_checkpoint(run_dir / "checkpoints")
        if latest is not None and not resume:
            raise ConfigError(f"{run_dir}: already holds checkpoints; resume=True continues that run, or choose "
                              "another run directory")
        if cfg.train.extend_vocab is not None and dist.is_main:
            cfg = extend_run_vocabulary(cfg, run_dir)
        elif cfg.train.extend_vocab is not None:  # made by rank 0 before the barrier below
            cfg = replace(cfg, data=replace(cfg.data, tokenizer=str(run_dir / TOKENIZER_DIR)))
        if dist.is_main:
            run_dir.mkdir(parents=True, exist_ok=True)
            save_yaml(cfg.to_dict(), run_dir / "config.yaml")
        if not (run_dir / RUN_SUBDIR).exists():
            # init_from's tokenizer prepares the data, which keeps a copy (RUN_DIR/prepared/tokenizer)
            # that the run reads from then on: neither its saved config nor a resume names init_from's
            # directory, so the run survives that directory being moved or deleted
            cfg = cfg.with_init_tokenizer()
        if dist.is_main:
            data = run_data(cfg, run_dir)
        barrier(dist)
        if not dist.is_main:
            data = run_data(cfg, run_dir)
        trainer = Trainer(cfg, run_dir, data, dist, device)
        if resume and latest is not None:
            trainer.restore_intact(run_dir / "checkpoints")
        elif cfg.train.init_from is not None:
            trainer.init_from(Path(cfg.train.init_from))
        reason = trainer.train()
        if reason == PREEMPTED:
            return trainer, trainer.preempted()
        metrics = trainer.finish(reason)
        return trainer, metrics
    finally:
        shutdown_distributed()
