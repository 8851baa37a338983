"""T5's span corruption (Raffel et al., 2020, Sec. 3.1.4 and 3.3.4): the batches of ``train.task: span``.

Of each sentence's tokens about ``NOISE_DENSITY`` (15%) are dropped, in spans of about
``MEAN_SPAN`` (3) tokens. Each dropped span is replaced in the input by one sentinel
``<extra_id_N>``, N counting up from 0; the target is each sentinel followed by the span it
stands for, then EOS::

    tokens:  Thank you for inviting me to your party last week .
    input:   Thank you <extra_id_0> me to your party <extra_id_1> week . EOS
    target:  <extra_id_0> for inviting <extra_id_1> last EOS     (BOS first in the decoder input)

The mask is Hugging Face's ``random_spans_noise_mask`` of ``run_t5_mlm_flax.py`` (itself T5's
``t5.data.preprocessors``), number of spans included: the sentence alternates non-noise and
noise spans, starting with non-noise and ending with noise, so the target ends with the last
dropped span (and the input with its sentinel) before EOS. The sentinels are pieces of the
tokenizer, T5's last ids counting down (``data.sentinels`` reserves them; an imported T5 has
them); they are found by name, so any tokenizer with them works.

The random source is a NumPy generator from a key (:func:`span_generator`): training corrupts a
step's batches from (train.seed, TRAIN_STREAM, epoch, batch index), as the masked LM masks them,
so a resumed run corrupts as the first did; validation corrupts each sentence by a key of its own.

Legend: B batch, S input length, T target length, L a sentence's length.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from transduce.data.batch import Batch, pad
from transduce.data.spm_model import sentinel_piece
from transduce.errors import ConfigError

NOISE_DENSITY = 0.15  # T5's share of dropped tokens
MEAN_SPAN = 3.0       # T5's mean dropped-span length


def span_generator(*key: int) -> np.random.Generator:
    """A NumPy generator seeded from ``key``, non-negative integers (as
    :func:`~transduce.data.encoder_inputs.masking_generator`'s key)."""
    return np.random.default_rng(np.random.SeedSequence(key))


def noise_span_count(length: int, density: float = NOISE_DENSITY, mean_span: float = MEAN_SPAN) -> int:
    """How many spans a sentence of ``length`` tokens loses (HF's computation; 0 below 2 tokens)."""
    if length < 2:
        return 0
    noise = min(max(int(np.round(length * density)), 1), length - 1)
    return max(int(np.round(min(noise, length - noise) / mean_span)), 1)


def random_spans_noise_mask(length: int, rng: np.random.Generator, density: float = NOISE_DENSITY,
                            mean_span: float = MEAN_SPAN) -> np.ndarray:
    """Which of ``length`` tokens are dropped: HF's ``random_spans_noise_mask`` with ``rng``.

    ``round(length * density)`` tokens (at least 1, at most ``length - 1``) in
    :func:`noise_span_count` spans, the span lengths a random partition of the dropped and of the
    kept tokens. A sentence under 2 tokens loses nothing. Returns a (L,) bool array.
    """
    spans = noise_span_count(length, density, mean_span)
    if spans == 0:
        return np.zeros(length, dtype=bool)
    noise = min(max(int(np.round(length * density)), 1), length - 1)

    def segmentation(items: int, segments: int) -> np.ndarray:  # a random partition into positive parts
        first = np.arange(items - 1) < (segments - 1)
        rng.shuffle(first)
        return np.bincount(np.cumsum(np.pad(first, [[1, 0]])), minlength=segments)

    interleaved = np.stack([segmentation(length - noise, spans), segmentation(noise, spans)], axis=1).reshape(-1)
    starts = np.zeros(length, dtype=np.int64)
    starts[np.cumsum(interleaved)[:-1]] = 1
    return np.cumsum(starts) % 2 == 1


def corrupt(ids: Sequence[int], mask: np.ndarray, sentinels: Sequence[int]) -> tuple[list[int], list[int]]:
    """The input and target of a sentence whose ``mask`` tokens are dropped (no EOS yet).

    Each maximal run of dropped tokens becomes ``sentinels[n]`` in the input (n-th run); the
    target is ``sentinels[n]`` followed by that run, for each run in order.
    """
    inputs: list[int] = []
    target: list[int] = []
    n = 0
    for i, (token, dropped) in enumerate(zip(ids, mask)):
        if dropped and (i == 0 or not mask[i - 1]):
            inputs.append(sentinels[n])
            target.append(sentinels[n])
            n += 1
        (target if dropped else inputs).append(int(token))
    return inputs, target


def span_batch(rows: Sequence[Sequence[int]], sentinels: Sequence[int],
               rng: np.random.Generator | Sequence[np.random.Generator]) -> Batch:
    """A span-corruption batch of raw sentences ``rows``: ``src`` the inputs + EOS, ``tgt_in``
    BOS + targets, ``tgt_out`` targets + EOS (as :func:`~transduce.data.batch.collate` lays out a
    pair); all rows from one generator (training) or each from its own (held-out text: a sentence
    is then corrupted the same way in any batch). Shape: (B, S), (B, T), (B, T)."""
    rngs = [rng] * len(rows) if isinstance(rng, np.random.Generator) else rng
    pairs = [corrupt(row, random_spans_noise_mask(len(row), r), sentinels) for row, r in zip(rows, rngs, strict=True)]
    return Batch(pad([s for s, _ in pairs], eos=True), pad([t for _, t in pairs], bos=True),
                 pad([t for _, t in pairs], eos=True), sum(len(s) + 1 for s, _ in pairs),
                 sum(len(t) + 1 for _, t in pairs))


def sentinel_ids(tokenizer, side: str, needed: int) -> list[int]:
    """The ids of ``<extra_id_0>``... on ``side`` of ``tokenizer``: at least ``needed`` of them
    (the most spans a training sentence has), else a one-line error."""
    size = tokenizer.src_vocab_size if side == "src" else tokenizer.tgt_vocab_size
    ids = {piece: i for i, piece in enumerate(tokenizer.pieces(range(size), side)) if piece.startswith("<extra_id_")}
    found = []
    while sentinel_piece(len(found)) in ids:
        found.append(ids[sentinel_piece(len(found))])
    if len(found) < needed:
        raise ConfigError(f"data.sentinels: train.task span needs {needed} sentinels <extra_id_N> in the {side} "
                          f"tokenizer (a sentence of the training data has that many spans); it has {len(found)} "
                          "(set data.sentinels when training a tokenizer, or use one that has them)")
    return found


def span_sentinels(tokenizer, *lengths: np.ndarray) -> list[int]:
    """The source side's sentinel ids for span corruption of sentences of ``lengths`` (the
    prepared splits' source lengths): one-line error if the tokenizer has too few."""
    longest = [int(np.max(x)) for x in lengths if len(x)]
    needed = max((noise_span_count(n) for n in range(max(longest, default=0) + 1)), default=0)
    return sentinel_ids(tokenizer, "src", needed)
