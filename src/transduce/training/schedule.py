"""Learning-rate schedules as pure functions of the step (so resuming needs only the step).

"noam" is the paper's Eq. 3: lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5),
optionally multiplied by ``lr_scale``. The others take a peak ``lr``:
  inverse_sqrt  linear warmup to lr, then lr * sqrt(warmup / step)   (fairseq)
  cosine        linear warmup, then cosine decay to min_lr at max_steps
  linear        linear warmup, then linear decay to min_lr at max_steps (anneal to the deadline)
  constant      lr after a linear warmup
"""

from __future__ import annotations

import math

from ..config import TrainConfig


def learning_rate(step: int, cfg: TrainConfig, d_model: int, total_steps: int | None = None) -> float:
    """Learning rate for optimizer step ``step`` (1-based).

    ``total_steps`` overrides ``cfg.max_steps`` as the end of cosine/linear decay (a time budget
    can estimate it while training).
    """
    step = max(step, 1)
    warmup = cfg.warmup_steps
    if cfg.schedule == "noam":
        w = max(warmup, 1)
        return cfg.lr_scale * d_model ** -0.5 * min(step ** -0.5, step * w ** -1.5)
    peak = cfg.lr
    if warmup and step < warmup:
        return peak * step / warmup
    if cfg.schedule == "inverse_sqrt":
        return peak * math.sqrt(max(warmup, 1) / step)
    if cfg.schedule == "constant":
        return peak
    total = total_steps or cfg.max_steps
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if cfg.schedule == "cosine":
        return cfg.min_lr + (peak - cfg.min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))
    return cfg.min_lr + (peak - cfg.min_lr) * (1.0 - progress)  # linear
