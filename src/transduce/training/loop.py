"""The training loop: the paper's recipe (Sec. 5) by default, resumable exactly.

One run directory holds everything::

    RUN_DIR/config.yaml        the resolved run config
    RUN_DIR/prepared/          the prepared data (made once unless data.prepared names one)
    RUN_DIR/metrics.jsonl      one JSON object per log line / validation
    RUN_DIR/checkpoints/       step_XXXXXXXX/ (each a loadable model dir + training state), latest
    RUN_DIR/model/  best/      the final and the best model (by validation BLEU, else loss)
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel

from ..config import RunConfig, save_yaml, with_vocab
from ..data.batch import Batch
from ..data.batching import BatchPlan, token_budget_batches
from ..data.corpus import sample_tokens
from ..data.prepare import prepared_for_run
from ..data.prepared import PreparedData, TokenPairs, length_dtype
from ..data.tokenizer import Tokenizer
from ..device import autocast_context, resolve_device
from ..errors import CheckpointError, ConfigError, TransduceError
from ..model.io import load_state_checked
from ..model.transformer import Transformer
from .checkpoint import (average_checkpoints, latest_checkpoint, list_checkpoints, load_checkpoint,
                         save_checkpoint, save_model_dir)
from .distributed import DistInfo, barrier, init_distributed, shutdown_distributed
from .loss import label_smoothed_loss, projected_label_smoothed_loss
from .progress import Progress
from .schedule import learning_rate

logger = logging.getLogger("transduce.training")


class TrainingError(TransduceError):
    """Training cannot continue (e.g. repeated non-finite losses)."""


@dataclass
class TrainState:
    """The counters a checkpoint's ``state.json`` stores besides weights and optimizer."""

    step: int = 0
    epoch: int = 0
    offset: int = 0            # plan batches of ``epoch`` already consumed, all ranks together
    tokens: int = 0            # target tokens trained on, all ranks together
    skipped_steps: int = 0     # steps skipped for non-finite loss or gradients
    bad_in_a_row: int = 0
    best: float | None = None  # best validation score (BLEU, or -loss)
    evals_since_best: int = 0
    elapsed: float = 0.0       # seconds of training before this process started


def output_weight(model: torch.nn.Module) -> torch.Tensor:
    """The output projection's weight of a model, through DDP and ``torch.compile`` wrappers."""
    model = getattr(model, "_orig_mod", model)
    model = getattr(model, "module", model)
    return model.output_proj.weight


def forward_backward(model: torch.nn.Module, batches: list[Batch], smoothing: float, pad_id: int,
                     normalizer: float, precision: str, device: torch.device,
                     scaler: torch.amp.GradScaler | None = None) -> tuple[float, float, int]:
    """Accumulate gradients of sum(loss) / normalizer over micro-batches.

    ``normalizer`` is the target-token count of the whole step divided by the world size, so
    that after DDP averages gradients across ranks they equal those of one process that saw
    the whole step's batches (the loss is per target token, as in the paper's batches).

    Returns the summed smoothed loss, summed NLL and token count of these batches.
    """
    loss_sum = nll_sum = 0.0
    n_tokens = 0
    for i, batch in enumerate(batches):
        last = i == len(batches) - 1
        sync = contextlib.nullcontext() if last or not isinstance(model, DistributedDataParallel) else model.no_sync()
        with sync:
            if precision == "fp32":  # projection and loss fused, the (B, T, V) logits never stored
                hidden = model(batch.src, batch.tgt_in, project=False)   # (B, T, D)
                out = projected_label_smoothed_loss(hidden, output_weight(model), batch.tgt_out, smoothing, pad_id)
            else:
                with autocast_context(device, precision, "train.precision"):
                    logits = model(batch.src, batch.tgt_in)              # (B, T, V)
                out = label_smoothed_loss(logits, batch.tgt_out, smoothing, pad_id)
            scaled = out.loss / normalizer
            (scaler.scale(scaled) if scaler is not None else scaled).backward()
        loss_sum += out.loss.item()
        nll_sum += out.nll.item()
        n_tokens += int(out.n_tokens)
    return loss_sum, nll_sum, n_tokens


def build_optimizer(model: torch.nn.Module, cfg) -> torch.optim.Optimizer:
    """Adam(beta1=0.9, beta2=0.98, eps=1e-9) as Sec. 5.3; AdamW decays only matrices."""
    params = [p for p in model.parameters() if p.requires_grad]
    kwargs: dict[str, Any] = dict(lr=0.0, betas=tuple(cfg.betas), eps=cfg.eps)
    if cfg.optimizer == "adamw":
        decay = [p for p in params if p.dim() >= 2]
        no_decay = [p for p in params if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, foreach=True, **kwargs)
    return torch.optim.Adam(params, weight_decay=cfg.weight_decay, foreach=True, **kwargs)


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
        self.model_cfg = with_vocab(cfg.model, tok.src_vocab_size, tok.tgt_vocab_size)
        torch.manual_seed(cfg.train.seed)
        self.model = Transformer(self.model_cfg).to(device)
        self.optimizer = build_optimizer(self.model, cfg.train)
        self.scaler = torch.amp.GradScaler("cuda") if cfg.train.precision == "fp16" else None
        wrapped: torch.nn.Module = self.model
        if dist.enabled:
            wrapped = DistributedDataParallel(self.model, device_ids=[device.index] if device.type == "cuda" else None)
        self.step_model = torch.compile(wrapped) if cfg.train.compile else wrapped
        self._epoch: EpochData | None = None
        self.state = TrainState()
        self.metrics_path = run_dir / "metrics.jsonl"
        self._last_eval: dict[str, float] | None = None
        self._t0 = time.monotonic()

    # ---- state ---------------------------------------------------------------------------------

    def restore(self, path: Path) -> None:
        """Continue from a checkpoint: weights, optimizer, RNG, data position and counters."""
        weights, trainer_state, info = load_checkpoint(path)
        if Tokenizer.exists(path) and Tokenizer.load(path).digest() != self.data.tokenizer.digest():
            raise CheckpointError(f"{path}: its tokenizer is not the one {self.data.root} was prepared with "
                                  "(resume with the data this run was trained on)")
        load_state_checked(self.model, weights, str(path))
        self.optimizer.load_state_dict(trainer_state["optimizer"])
        torch.set_rng_state(trainer_state["rng_cpu"])
        if "rng_cuda" in trainer_state and torch.cuda.is_available():
            torch.cuda.set_rng_state(trainer_state["rng_cuda"])
        if self.scaler is not None and "scaler" in trainer_state:
            self.scaler.load_state_dict(trainer_state["scaler"])
        self.state = TrainState(**info["train_state"])
        logger.info("resumed from %s (step %d, epoch %d)", path, self.state.step, self.state.epoch)

    def save(self) -> Path | None:
        """Write a checkpoint (rank 0 only)."""
        if not self.dist.is_main:
            return None
        trainer_state: dict[str, Any] = {"optimizer": self.optimizer.state_dict(), "rng_cpu": torch.get_rng_state()}
        if self.device.type == "cuda":
            trainer_state["rng_cuda"] = torch.cuda.get_rng_state(self.device)
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
            plan = token_budget_batches(pairs.src_lens, pairs.tgt_lens, dc.max_tokens, self.cfg.train.seed, epoch)
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

    def next_group(self) -> list[np.ndarray]:
        """The plan batches of the next optimizer step: grad_accum per rank, all ranks together.

        The position is counted in plan batches, so a run can resume on another world size. The
        tail of an epoch too short for a whole step is skipped.
        """
        need = self.cfg.train.grad_accum * self.dist.world_size
        plan = self.epoch_data(self.state.epoch).plan
        if len(plan) < need:
            raise ConfigError(f"data.max_tokens: an epoch has only {len(plan)} batches, fewer than one step "
                              f"needs ({need} = grad_accum x world size)")
        if self.state.offset + need > len(plan):
            self.state.epoch, self.state.offset = self.state.epoch + 1, 0
            plan = self.epoch_data(self.state.epoch).plan
        group = [plan[i] for i in range(self.state.offset, self.state.offset + need)]
        self.state.offset += need
        return group

    # ---- one step ------------------------------------------------------------------------------

    def train_step(self) -> dict[str, float] | None:
        """One optimizer step; returns its metrics, or None if it was skipped as non-finite."""
        cfg = self.cfg.train
        group = self.next_group()
        mine = group[self.dist.rank::self.dist.world_size]
        epoch = self.epoch_data(self.state.epoch)  # the epoch ``group`` came from
        step_tokens = sum(int(epoch.pairs.tgt_lens[b].sum()) + len(b) for b in group)
        lr = learning_rate(self.state.step + 1, cfg, self.model_cfg.d_model, self._total_steps())
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        self.step_model.train()
        batches = [epoch.pairs.batch(b).to(self.device) for b in mine]
        epoch.pairs.release()  # the ids are copied: their pages need not stay in this process
        loss, nll, n = forward_backward(self.step_model, batches, cfg.label_smoothing, self.model_cfg.pad_id,
                                        step_tokens / self.dist.world_size, cfg.precision, self.device, self.scaler)
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.clip_norm or math.inf).item()
        finite = math.isfinite(loss) and (self.scaler is not None or math.isfinite(grad_norm))
        if finite:
            if self.scaler is not None:
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.state.step += 1
        self.state.tokens += step_tokens
        if not finite:
            return self._bad_step(loss, grad_norm)
        self.state.bad_in_a_row = 0
        return {"loss": loss / max(n, 1), "nll": nll / max(n, 1), "lr": lr, "grad_norm": grad_norm}

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
        """Validation loss/perplexity and (greedy) BLEU on the validation split."""
        from .validation import validation_bleu, validation_loss
        self.model.eval()
        out: dict[str, float] = {}
        if len(self.valid_pairs):
            loss, nll = validation_loss(self.model, self.valid_pairs, self.cfg, self.device)
            out.update(val_loss=loss, val_ppl=math.exp(min(nll, 50.0)))
        if self.cfg.train.eval_bleu and self.valid_texts:
            out["val_bleu"] = validation_bleu(self.model, self.data.tokenizer, self.valid_texts, self.cfg, self.device)
        return out

    def _improved(self, metrics: dict[str, float]) -> bool:
        score = metrics.get("val_bleu", -metrics.get("val_loss", math.inf))
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
            metrics = self.train_step()
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
        return metrics


def run_training(cfg: RunConfig, run_dir: Path, resume: bool = False) -> tuple[Trainer, dict[str, float]]:
    """Prepare data, build or restore the trainer, train, and write the final model."""
    device = resolve_device(cfg.train.device, "train.device")
    dist = init_distributed(device.type)
    if dist.enabled and device.type == "cuda":
        device = torch.device("cuda", dist.local_rank)
    try:
        if cfg.train.num_threads:
            torch.set_num_threads(cfg.train.num_threads)
        latest = latest_checkpoint(run_dir / "checkpoints")
        if latest is not None and not resume:
            raise ConfigError(f"--out: {run_dir} already holds checkpoints; pass --resume to continue "
                              "or choose a new --out")
        if dist.is_main:
            run_dir.mkdir(parents=True, exist_ok=True)
            save_yaml(cfg.to_dict(), run_dir / "config.yaml")
            data = prepared_for_run(cfg.data, run_dir, cfg.train.seed)
        barrier(dist)
        if not dist.is_main:
            data = prepared_for_run(cfg.data, run_dir, cfg.train.seed)
        trainer = Trainer(cfg, run_dir, data, dist, device)
        if resume and latest is not None:
            trainer.restore(latest)
        reason = trainer.train()
        metrics = trainer.finish(reason)
        return trainer, metrics
    finally:
        shutdown_distributed()
