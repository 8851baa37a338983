"""Token-budget batching: a pure function of sentence lengths (paper, Section 5.1).

"Sentence pairs were batched together by approximate sequence length. Each training batch
contained a set of sentence pairs containing approximately 25000 source tokens and 25000
target tokens." We bound the *padded* size instead, which is what memory depends on:

    budget rule:  n_sentences * max(max_src_len + 1, max_tgt_len + 1) <= max_tokens

where lengths are raw token counts and the ``+ 1`` is the EOS on the source and the BOS/EOS on
the target (see ``corpus.collate``). Pairs are sorted by (target length, source length) with a
seeded random tie-break, packed greedily, and the batch order is shuffled from
``(seed, epoch)``: same seed and epoch, same batches, on every machine.

Distributed training: every rank builds the same plan and rank ``r`` of ``W`` takes batches
``r, r + W, r + 2W, ...``; the last ``len(batches) % W`` batches are dropped so that all ranks
take the same number of optimizer steps.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from typing import Iterator, Sequence

from transduce.errors import DataError

logger = logging.getLogger(__name__)


@dataclass
class BatchPlan:
    """Batches of one epoch (lists of pair indices) and how many pairs did not fit any batch."""

    batches: list[list[int]] = field(default_factory=list)
    dropped: int = 0


def padded_width(src_len: int, tgt_len: int) -> int:
    """Padded positions one pair needs: its longer side plus EOS/BOS."""
    return max(src_len + 1, tgt_len + 1)


def token_budget_batches(src_lens: Sequence[int], tgt_lens: Sequence[int], max_tokens: int,
                         seed: int, epoch: int, shuffle: bool = True) -> BatchPlan:
    """Group pair indices into length-bucketed batches under a padded token budget.

    Args:
        src_lens, tgt_lens: raw token counts of each pair (no EOS/BOS).
        max_tokens: budget; every batch satisfies the rule in the module docstring.
        seed, epoch: determine the tie-break inside equal lengths and the batch order.
        shuffle: if False, ties keep index order and batches stay sorted by length.

    Returns:
        A :class:`BatchPlan`; every pair that fits the budget appears in exactly one batch.
    """
    if len(src_lens) != len(tgt_lens):
        raise ValueError(f"{len(src_lens)} source lengths but {len(tgt_lens)} target lengths")
    if max_tokens < 2:
        raise ValueError(f"max_tokens must be at least 2, got {max_tokens}")
    kept = [i for i in range(len(src_lens)) if padded_width(src_lens[i], tgt_lens[i]) <= max_tokens]
    dropped = len(src_lens) - len(kept)
    if dropped:
        logger.warning("%d pairs are longer than max_tokens=%d on their own; dropped",
                       dropped, max_tokens)
    rng = random.Random(f"transduce.batching:{seed}:{epoch}")
    order = _length_order(kept, src_lens, tgt_lens, rng if shuffle else None)
    batches = _pack(order, src_lens, tgt_lens, max_tokens)
    if shuffle:
        rng.shuffle(batches)
    return BatchPlan(batches, dropped)


def _length_order(indices: list[int], src_lens: Sequence[int], tgt_lens: Sequence[int],
                  rng: random.Random | None) -> list[int]:
    """Sort by (tgt_len, src_len); ties broken by ``rng`` (or by index when None)."""
    if rng is None:
        return sorted(indices, key=lambda i: (tgt_lens[i], src_lens[i], i))
    tiebreak = {i: rng.random() for i in indices}
    return sorted(indices, key=lambda i: (tgt_lens[i], src_lens[i], tiebreak[i]))


def _pack(order: list[int], src_lens: Sequence[int], tgt_lens: Sequence[int],
          max_tokens: int) -> list[list[int]]:
    """Greedily fill batches in ``order`` while ``n * width <= max_tokens``."""
    batches: list[list[int]] = []
    current: list[int] = []
    width = 0
    for i in order:
        new_width = max(width, padded_width(src_lens[i], tgt_lens[i]))
        if current and (len(current) + 1) * new_width > max_tokens:
            batches.append(current)
            current, new_width = [], padded_width(src_lens[i], tgt_lens[i])
        current.append(i)
        width = new_width
    if current:
        batches.append(current)
    return batches


def shard_batches(batches: list[list[int]], rank: int, world_size: int) -> list[list[int]]:
    """Rank ``rank``'s share: batches ``rank, rank + W, ...``, the uneven tail dropped."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    usable = len(batches) - len(batches) % world_size
    return batches[rank:usable:world_size]


class BatchIterator:
    """Resumable, shardable iteration over token-budget batches, one epoch per ``for`` loop.

    Iterating yields this rank's batches of the current epoch, starting at ``offset``; when the
    epoch is exhausted, ``epoch`` advances (a fresh deterministic shuffle) and ``offset``
    resets. ``state_dict()`` taken while a batch is being used says ``offset`` = the index of
    the *next* batch, so restoring it and iterating continues exactly where training stopped.

    Examples:
        >>> it = BatchIterator(src_lens, tgt_lens, max_tokens=4096, seed=1)  # doctest: +SKIP
        >>> for batch in it:  # one epoch                                    # doctest: +SKIP
        ...     train_step(collate([pairs[i] for i in batch]))
    """

    def __init__(self, src_lens: Sequence[int], tgt_lens: Sequence[int], max_tokens: int,
                 seed: int = 0, shuffle: bool = True, rank: int = 0, world_size: int = 1):
        shard_batches([], rank, world_size)  # validates rank / world_size
        self.src_lens, self.tgt_lens = list(src_lens), list(tgt_lens)
        self.max_tokens, self.seed, self.shuffle = max_tokens, seed, shuffle
        self.rank, self.world_size = rank, world_size
        self.epoch, self.offset = 0, 0
        self._cache: tuple[int, BatchPlan] | None = None

    def plan(self, epoch: int) -> BatchPlan:
        """The full (unsharded) plan of ``epoch``; the latest one is cached."""
        if self._cache is None or self._cache[0] != epoch:
            plan = token_budget_batches(self.src_lens, self.tgt_lens, self.max_tokens,
                                        self.seed, epoch, self.shuffle)
            self._cache = (epoch, plan)
        return self._cache[1]

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        """This rank's batches of ``epoch``."""
        return shard_batches(self.plan(epoch).batches, self.rank, self.world_size)

    def __len__(self) -> int:
        """Batches this rank takes in the current epoch (including ones already taken)."""
        return len(self.epoch_batches(self.epoch))

    def __iter__(self) -> Iterator[list[int]]:
        batches = self.epoch_batches(self.epoch)
        while self.offset < len(batches):
            batch = batches[self.offset]
            self.offset += 1  # before yielding: a checkpoint saved now resumes after this batch
            yield batch
        self.epoch, self.offset = self.epoch + 1, 0

    def shard(self, rank: int, world_size: int) -> "BatchIterator":
        """A copy of this iterator (same position) that yields only rank ``rank``'s batches."""
        other = BatchIterator(self.src_lens, self.tgt_lens, self.max_tokens, self.seed,
                              self.shuffle, rank, world_size)
        other.epoch, other.offset = self.epoch, self.offset
        return other

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "offset": self.offset}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Restore a position saved by :meth:`state_dict`."""
        epoch, offset = state.get("epoch"), state.get("offset")
        if not isinstance(epoch, int) or not isinstance(offset, int) or epoch < 0 or offset < 0:
            raise DataError(f"batch iterator state: expected non-negative 'epoch' and 'offset', "
                            f"got {state!r}")
        n = len(self.epoch_batches(epoch))
        if offset > n:
            raise DataError(f"batch iterator state: offset {offset} is past the {n} batches of "
                            f"epoch {epoch} (did the data, max_tokens or world size change?)")
        self.epoch, self.offset = epoch, offset


def batch_stats(batches: Sequence[Sequence[int]], src_lens: Sequence[int],
                tgt_lens: Sequence[int]) -> dict[str, float]:
    """Summary of a batch plan; token counts include EOS (source) and BOS/EOS (target).

    Returns:
        ``n_batches``, ``n_sentences``, ``mean_sentences`` per batch, ``mean_src_tokens`` and
        ``mean_tgt_tokens`` (real, per batch), ``src_pad_ratio`` and ``tgt_pad_ratio`` (share
        of padded positions that are padding), ``mean_padded_tokens`` and
        ``max_padded_tokens`` (the budget quantity ``n * max(src + 1, tgt + 1)``).
    """
    real_src = real_tgt = padded_src = padded_tgt = 0
    padded = []
    for batch in batches:
        src = [src_lens[i] + 1 for i in batch]
        tgt = [tgt_lens[i] + 1 for i in batch]
        real_src, real_tgt = real_src + sum(src), real_tgt + sum(tgt)
        padded_src += len(batch) * max(src)
        padded_tgt += len(batch) * max(tgt)
        padded.append(len(batch) * max(max(src), max(tgt)))
    n = len(padded)
    n_sentences = sum(len(b) for b in batches)
    return {
        "n_batches": n,
        "n_sentences": n_sentences,
        "mean_sentences": n_sentences / n if n else 0.0,
        "mean_src_tokens": real_src / n if n else 0.0,
        "mean_tgt_tokens": real_tgt / n if n else 0.0,
        "src_pad_ratio": 1 - real_src / padded_src if padded_src else 0.0,
        "tgt_pad_ratio": 1 - real_tgt / padded_tgt if padded_tgt else 0.0,
        "mean_padded_tokens": sum(padded) / n if n else 0.0,
        "max_padded_tokens": max(padded, default=0),
    }
