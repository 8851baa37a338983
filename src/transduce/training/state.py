"""What a training run counts and carries between steps: the counters a checkpoint stores, one
step's batches, one epoch's plan, and the error that stops a run."""

from __future__ import annotations

from dataclasses import dataclass

from ..data.batch import Batch
from ..data.epoch_batches import BatchPlan
from ..data.prepared import TokenPairs
from ..errors import TransduceError


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
