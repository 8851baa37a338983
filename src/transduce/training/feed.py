"""The batches each optimizer step trains on: one batch plan per epoch (a function of seed and
epoch), BPE-dropout re-segmentation, and the device copies, padded to shape buckets.

A data position is (epoch, offset), counted in plan batches of all ranks together, so a run can
resume on another world size; nothing here moves the :class:`~.state.TrainState`.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..config import RunConfig
from ..data.batch import Batch, Specials
from ..data.alignments import word_starts
from ..data.epoch_batches import round_up, token_budget_batches
from ..data.corpus import sample_tokens
from ..data.encoder_inputs import (TRAIN_STREAM, classification_batch, masked_batch, masking_generator,
                                   next_sentence_batch)
from ..data.multilingual import PairDraws
from ..data.prepared import PreparedData, TokenPairs, length_dtype
from ..data.span_corruption import span_batch, span_generator
from ..errors import ConfigError
from .distributed import DistInfo
from .state import EpochData, StepData


class StepFeed:
    """Makes :class:`StepData` for this rank from the prepared training split.

    Args:
        cfg: the run's config (``data``, ``train``, ``task``).
        data: the prepared data.
        dist: this process's rank and the world size.
        device: where the batches go.
        pad_multiple: S and T are padded up to a multiple of it (few shapes for CUDA graphs).
        mask_id: the [MASK] id, for ``task`` mlm (None otherwise).
        sentinels: the ids of ``<extra_id_0>``..., for ``task`` span.
    """

    def __init__(self, cfg: RunConfig, data: PreparedData, dist: DistInfo, device: torch.device,
                 pad_multiple: int, mask_id: int | None, sentinels: Sequence[int] = ()):
        self.cfg, self.data, self.dist, self.device = cfg, data, dist, device
        self.pad_multiple, self.mask_id, self.sentinels = pad_multiple, mask_id, sentinels
        self.specials = Specials.of(cfg.model)  # the model's ids: an imported GPT-2's are not ours
        self.train_pairs = data.split("train")
        self._epoch: EpochData | None = None
        self.guide = None  # the training pairs' word links and word starts: batches with guided alignment targets
        if data.has_alignments("train") and cfg.train.guided_alignment_weight > 0 and cfg.task_spec.translates:
            tok = data.tokenizer
            self.guide = (data.alignments("train"), (word_starts(tok, "src", tok.src_vocab_size),
                                                     word_starts(tok, "tgt", tok.tgt_vocab_size)))
        self.pair_draws = PairDraws.of(cfg.data, self.train_pairs, data.tokenizer) if cfg.data.pairs else None

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
            lengths = pairs.task_lengths(self.cfg.task)
            drawn = None if self.pair_draws is None else self.pair_draws.epoch(self.cfg.train.seed, epoch)
            if drawn is not None:  # multilingual: this epoch's sentences, drawn by language pair
                lengths = (lengths[0][drawn], lengths[1][drawn])
            plan = token_budget_batches(*lengths, dc.max_tokens, self.cfg.train.seed, epoch, multiple=multiple)
            if drawn is not None:
                plan.order = drawn[plan.order]
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

    def step_data(self, epoch: int, offset: int) -> StepData:
        """The plan batches of the step at (epoch, offset): grad_accum per rank, all ranks together.

        The tail of an epoch too short for a whole step is skipped.
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
        mine = slice(self.dist.rank, None, self.dist.world_size)
        if self.cfg.task_spec.labelled:
            tokens = sum(len(b) for b in group)  # the loss is per sentence
            batches = [self._device_batch(classification_batch(data.pairs.batch(b))) for b in group[mine]]
        elif self.cfg.task_spec.corrupted:  # every rank makes the whole step: the normaliser counts all of it
            made = [self._masked(data.pairs, b, (self.cfg.train.seed, TRAIN_STREAM, epoch, offset + j))
                    for j, b in enumerate(group)]
            tokens = sum(b.n_tgt_tokens for b in made)
            batches = [self._device_batch(b) for b in made[mine]]
        else:
            tokens = sum(int(data.pairs.tgt_lens[b].sum()) + len(b) for b in group)
            batches = [self._device_batch(data.pairs.batch(b, self.specials, self.guide)) for b in group[mine]]
        data.pairs.release()  # the ids are copied: their pages need not stay in this process
        return StepData(start, (epoch, offset + need), batches, tokens)

    def _masked(self, pairs: TokenPairs, indices, key: tuple[int, ...]) -> Batch:
        """A masked-LM batch of lines ``indices`` (for a model with ``model.nsp``, of each line
        and the next (or a random) one, with next-sentence labels), or a span-corruption batch;
        its randomness from ``key``."""
        if self.cfg.task_spec.spans:
            return span_batch(pairs.rows(0, indices), self.sentinels, span_generator(*key))
        generator = masking_generator(*key)
        if self.cfg.model.nsp:
            return next_sentence_batch(pairs, indices, self.cfg.model.max_positions - 2, self.mask_id, generator)
        return masked_batch(pairs.batch(indices), self.mask_id, generator)

    def _device_batch(self, batch: Batch) -> Batch:
        """``batch`` padded to its shape bucket, on the device (through pinned memory on CUDA: the
        copy is asynchronous, queued behind the work already on the GPU)."""
        m, s, t = self.pad_multiple, batch.src.size(1), batch.tgt_in.size(1)
        if self.cfg.train.cuda_graphs:  # (max_tokens // L, L) for both sides: one graph per bucket L
            width = round_up(max(s, t), m)
            batch = batch.padded(self.cfg.data.max_tokens // width, width, width, self.specials)
        elif m > 1:
            batch = batch.padded(len(batch), round_up(s, m), round_up(t, m), self.specials)
        if self.device.type == "cuda":
            batch = batch.pin_memory()
        return batch.to(self.device)
