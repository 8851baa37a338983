"""The encoder-only tasks' batches: BERT's masking for a masked LM, and classification batches.

Masked language modelling (Devlin et al., 2019, Sec. 3.1, "Task #1: Masked LM"): 15% of the
non-special tokens are selected; of those 80% become [MASK], 10% a random token and 10% stay as
they are; the loss (``training/encoder_tasks.py``) is over the selected positions only. [MASK] is
the model's last id (:attr:`~transduce.model.EncoderOnly.mask_id`). Training masks its batches
here, and held-out perplexity (``evaluation/heldout.py``) masks its text the same way.

Next-sentence prediction (Sec. 3.1, "Task #2"), for a model with ``model.nsp``: each line of the
training split is paired with the line after it (IsNext, label 0) or, half of the time, with a
random line (NotNext, 1); the pair ``BOS a EOS b EOS`` (segments 0 and 1) is then masked as above.
The split's consecutive lines are its document: the line after the last is always random.

Legend: B batch, S source length, T length.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from torch import Tensor

from transduce.data.batch import Batch, pad
from transduce.data.labelled import sentence_pair
from transduce.data.prepared import TokenPairs
from transduce.data.tokenizer import BOS_ID, EOS_ID, PAD_ID

# Never selected for masking: they mark the sequence, not its text ([CLS], [SEP], [PAD] in BERT).
SPECIAL_IDS = (PAD_ID, BOS_ID, EOS_ID)
MASK_SHARE, RANDOM_SHARE = 0.8, 0.1  # of the selected tokens; the remaining 10% are kept
TRAIN_STREAM, VALID_STREAM = 0, 1    # the second number of a masking key (see masking_generator)


def mask_tokens(ids: Tensor, mask_id: int, generator: torch.Generator, select: float = 0.15,
                special_ids: Sequence[int] = SPECIAL_IDS) -> tuple[Tensor, Tensor]:
    """BERT's masking of a batch of ids, a pure function of ``ids`` and the generator's state.

    Each token not in ``special_ids`` is selected with probability ``select``; a selected token
    becomes ``mask_id`` (80%), a random ordinary token (10%: an id below ``mask_id``, not
    special) or stays (10%).

    Args:
        ids: (B, T) token ids, all below ``mask_id``.
        mask_id: the [MASK] id, the last of the vocabulary.
        generator: the random source (a CPU generator; the results move to ``ids.device``).
        select: the share of tokens selected.
        special_ids: ids never selected (PAD, BOS, EOS).

    Returns:
        inputs (B, T): ``ids`` with the selected tokens replaced; labels (B, T): the original
        ids at the selected positions and PAD elsewhere (what the loss ignores).
    """
    gen = dict(generator=generator, device=generator.device)
    selectable = ~torch.isin(ids, torch.tensor(list(special_ids), device=ids.device))
    selected = (torch.rand(ids.shape, **gen).to(ids.device) < select) & selectable
    action = torch.rand(ids.shape, **gen).to(ids.device)
    allowed = torch.ones(mask_id, dtype=torch.bool, device=ids.device)
    allowed[list(special_ids)] = False
    ordinary = allowed.nonzero().squeeze(1)                              # the ids a random token may take
    random_ids = ordinary[torch.randint(len(ordinary), ids.shape, **gen).to(ids.device)]
    inputs = torch.where(selected & (action < MASK_SHARE), mask_id, ids)
    inputs = torch.where(selected & (action >= MASK_SHARE) & (action < MASK_SHARE + RANDOM_SHARE), random_ids, inputs)
    labels = torch.where(selected, ids, PAD_ID)
    return inputs, labels


def masking_generator(*key: int) -> torch.Generator:
    """A CPU generator seeded from ``key``, non-negative integers (train.seed, :data:`TRAIN_STREAM` or
    :data:`VALID_STREAM`, epoch, index of the batch in the epoch's plan): the same key masks a batch
    the same way in any process, so a resumed run (on any number of processes) masks as the first
    did, and validation masks its split the same way at every evaluation."""
    return torch.Generator().manual_seed(int(np.random.SeedSequence(key).generate_state(1)[0]))


def masked_batch(batch: Batch, mask_id: int, generator: torch.Generator | Sequence[torch.Generator]) -> Batch:
    """A masked-LM batch from a collated batch's source side.

    The input is BOS + source + EOS (BOS plays [CLS], EOS [SEP]; the first position is the one a
    classification head later pools), masked by :func:`mask_tokens`: the whole batch from one
    generator (training), or each sentence from its own (held-out text: a sentence is then masked
    the same way whatever batch it is in). ``src`` and ``tgt_in`` are both the masked input,
    ``tgt_out`` the labels (PAD where not selected) and ``n_tgt_tokens`` the number of selected
    tokens: the loss normaliser (possibly 0).

    Shape: batch.src (B, S) -> src, tgt_in, tgt_out (B, S + 1).
    """
    ids = _bos_source(batch)                                             # (B, S + 1)
    if isinstance(generator, torch.Generator):
        inputs, labels = mask_tokens(ids, mask_id, generator)
    else:  # row i unpadded (its n tokens: padding only follows them), masked alone
        inputs, labels = ids.clone(), torch.full_like(ids, PAD_ID)
        for i, (n, gen) in enumerate(zip((ids != PAD_ID).sum(1).tolist(), generator, strict=True)):
            row_in, row_labels = mask_tokens(ids[i:i + 1, :n], mask_id, gen)   # (1, n)
            inputs[i, :n], labels[i, :n] = row_in[0], row_labels[0]
    return Batch(inputs, inputs, labels, batch.n_src_tokens + len(batch), int((labels != PAD_ID).sum()))


def next_sentence_batch(pairs: TokenPairs, indices: Sequence[int], room: int, mask_id: int,
                        generator: torch.Generator) -> Batch:
    """A masked-LM batch of sentence pairs with their next-sentence labels.

    Line ``i`` of ``indices`` is paired with line ``i + 1`` of ``pairs`` or (half of the time, and
    always for the last line) with a random other line; the pair is cut to ``room`` ids
    (:func:`~transduce.data.labelled.sentence_pair`) and masked by :func:`masked_batch`, all from
    ``generator``. ``next_labels`` holds 0 (IsNext) or 1 (NotNext).

    Args:
        pairs: the split's token pairs (their source side is read).
        indices: the lines of the batch.
        room: the most ids of ``a EOS b`` (the model's ``max_positions`` less BOS and EOS).
    """
    n, k = len(pairs), len(indices)
    swap = torch.rand(k, generator=generator) < 0.5                      # (B,)
    other = torch.randint(max(n - 1, 1), (k,), generator=generator)      # (B,)
    seconds, labels = [], []
    for i, s, j in zip(indices, swap.tolist(), other.tolist()):
        nxt = int(i) + 1
        if s or nxt >= n:  # a random line that is not the next one
            nxt, label = (j if j < nxt else j + 1) % n, 1
        else:
            label = 0
        seconds.append(nxt)
        labels.append(label)
    firsts, nexts = pairs.rows(0, indices), pairs.rows(0, seconds)
    src = pad([sentence_pair(a, b, room) for a, b in zip(firsts, nexts)], eos=True)   # (B, S)
    plain = Batch(src, src, src, int((src != PAD_ID).sum()), 0)
    out = masked_batch(plain, mask_id, generator)
    out.next_labels = torch.tensor(labels)
    return out


def classification_batch(batch: Batch) -> Batch:
    """A classification batch from a collated batch of (text, [label id]) pairs: ``src`` and
    ``tgt_in`` both BOS + text + EOS (BOS is the position the head pools; a sentence pair's text
    is ``a EOS b``, see :mod:`transduce.data.labelled`), ``tgt_out`` the (B, 1) label ids,
    ``n_tgt_tokens`` the number of sentences (the loss normaliser)."""
    inputs = _bos_source(batch)
    return Batch(inputs, inputs, batch.tgt_out[:, :1], batch.n_src_tokens + len(batch), len(batch))


def _bos_source(batch: Batch) -> Tensor:
    """BOS + source + EOS, PAD-padded: (B, S) -> (B, S + 1)."""
    return torch.cat([batch.src.new_full((len(batch), 1), BOS_ID), batch.src], dim=1)
