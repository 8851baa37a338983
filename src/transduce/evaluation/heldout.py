"""Scores of a language model, masked LM or classifier on a held-out file (``transduce evaluate``
for ``train.task`` lm, mlm and classify; translation models are scored by :mod:`.metrics`).

- lm: perplexity exp(NLL / tokens) of each line's tokens and EOS given BOS and the tokens before;
- mlm: the same over BERT's masked tokens, each line masked by a seeded key of its own (as a
  run's validation masks, both through :func:`heldout_loss`), so the figure depends on the seed
  but not on the batching;
- classify: accuracy and macro-F1 of a ``text<TAB>label`` file
  (:func:`score_labelled`, as ``classify --score``).

:func:`heldout_loss` is also a run's validation loss: the trainer passes its label-smoothed loss
as ``batch_loss``; here the default is the plain NLL (:func:`batch_nll`).
"""

from __future__ import annotations

import math
import os
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ..config import TASKS, TrainConfig, model_task
from ..data.batch import Batch, Specials, token_types
from ..data.corpus import read_lines
from ..data.encoder_inputs import VALID_STREAM, masked_batch, masking_generator, next_sentence_batch
from ..data.epoch_batches import token_budget_batches
from ..data.labelled import check_labels, read_labelled
from ..data.prepared import TokenPairs, length_dtype, token_dtype
from ..data.span_corruption import span_batch, span_generator
from ..data.tokenizer import PAD_ID, load_tokenizer
from ..device import resolve_device
from ..errors import ConfigError, DataError
from ..inference import Classifier, Runtime
from ..inference.placement import load_model_dir
from ..inference.search.common import output_log_softmax
from ..model.io import load_model_config
from .metrics import classification_scores

DEFAULT_SEED = TrainConfig.seed  # a default run's validation masking

# (model, batch on the model's device) -> the batch's summed loss, summed NLL and the number of
# tokens they are over (0-dim tensors): what heldout_loss adds up.
BatchLoss = Callable[[torch.nn.Module, "Batch"], tuple[Tensor, Tensor, Tensor]]


def batch_nll(model: torch.nn.Module, batch: "Batch") -> tuple[Tensor, Tensor, Tensor]:
    """The plain cross-entropy (no label smoothing) of ``batch``'s labels, summed, as both the
    loss and the NLL, and the count of labels that are not PAD: every target token and EOS of a
    translation model or LM; for a masked LM (its batch from
    :func:`~transduce.data.encoder_inputs.masked_batch`) the selected tokens, through its head
    on those positions only."""
    cfg, pad = model.config, model.config.label_pad_id
    states = cfg.family.states(model, batch, cfg)                       # (B, T, D)
    if cfg.family.masked_lm:
        pad = PAD_ID                                                     # the masking's "not selected"
        keep = batch.tgt_out != pad                                      # (B, T)
        logits, labels = model.mlm_logits(states[keep]), batch.tgt_out[keep]              # (N, V), (N,)
    else:
        logits, labels = model.output_proj(states).flatten(0, 1), batch.tgt_out.flatten()  # (B * T, V), (B * T,)
    if not cfg.bos_in_softmax:  # an imported T5: BOS (PAD's row again) is no class of its output
        logits = output_log_softmax(logits.float(), cfg)
    nll = F.cross_entropy(logits.float(), labels, ignore_index=pad, reduction="sum")
    return nll, nll, (labels != pad).sum()


@torch.no_grad()
def heldout_loss(model: torch.nn.Module, pairs: "TokenPairs", task: str, max_tokens: int, seed: int,
                 device: torch.device, batch_loss: BatchLoss = batch_nll,
                 sentinels: Sequence[int] = ()) -> tuple[float, float, int]:
    """Summed loss and NLL of held-out ``pairs`` and the token count they are over, batched by
    ``max_tokens``; batching does not change the sums (up to float rounding).

    Args:
        model: a plain (not DDP or compiled) model in eval mode.
        pairs: the held-out pairs (an LM reads their target side, a masked LM their source side).
        task: ``train.task``, translation, lm, mlm or span (mlm: sentence ``j`` masked by the key
            (seed, VALID_STREAM, 0, j), the same at every call; span: corrupted likewise).
        max_tokens: the token budget of a batch.
        seed: the masked LM's masking.
        device: where the model is.
        batch_loss: one batch's sums (:data:`BatchLoss`); the plain NLL by default.
        sentinels: span corruption's sentinel ids (task span).
    """
    plan = token_budget_batches(*pairs.task_lengths(task), max_tokens, seed=0, epoch=0, shuffle=False)
    loss = nll = 0.0
    n = 0
    spec = TASKS[task]
    for i in range(len(plan)):
        batch = pairs.batch(plan[i], Specials.of(model.config))
        if spec.masked:
            keys = [masking_generator(seed, VALID_STREAM, 0, int(j)) for j in plan[i]]
            batch = masked_batch(batch, model.mask_id, keys)
        elif spec.spans:
            rngs = [span_generator(seed, VALID_STREAM, 0, int(j)) for j in plan[i]]
            batch = span_batch(pairs.rows(0, plan[i]), sentinels, rngs)
        batch_sum, batch_nll_sum, count = batch_loss(model, batch.to(device))
        loss, nll, n = loss + batch_sum.item(), nll + batch_nll_sum.item(), n + int(count)
    return loss, nll, n


def perplexity(model_dir: str | os.PathLike, path: str | os.PathLike, batch_tokens: int = 4096,
               seed: int = DEFAULT_SEED, device: str = "cpu") -> dict[str, Any]:
    """Perplexity of a decoder-only LM, or masked-token perplexity of a masked LM, on a text file.

    Args:
        model_dir: a model directory of ``train.task`` lm or mlm.
        path: UTF-8 text (plain or gzip), one sentence a line; empty lines are skipped, a line too
            long for ``model.max_positions`` is cut to fit (counted in ``truncated``).
        batch_tokens: tokens per batch (no effect on the result).
        seed: the masked LM's masking (line ``j`` is masked by the key (seed, 1, 0, j)).
        device: cpu, cuda or auto.

    Returns:
        ``{"task", "perplexity", "nll" (mean per token, nats), "nll_total" (nats: comparable between
        tokenizers, e.g. before and after ``--extend-vocab``, for an LM), "tokens", "sentences",
        "truncated"}`` and, for a masked LM, ``"seed"``.
    """
    task = model_task(load_model_config(model_dir))
    spec = TASKS[task]
    if not spec.perplexity:
        raise ConfigError(f"{model_dir}: perplexity is for train.task lm or mlm models; this one is {task}")
    if batch_tokens < 1:
        raise ConfigError(f"decode.batch_tokens: must be positive; got {batch_tokens}")
    side, extra = spec.lengths[0], spec.added
    device = resolve_device(device)
    model, tokenizer = load_model_dir(model_dir, device), load_tokenizer(model_dir)
    room = model.config.max_positions - extra
    rows = tokenizer.encode_batch([line for line in read_lines(path) if line.strip()], side)
    if not rows:
        raise DataError(f"{path}: no text to score (every line is empty)")
    truncated = sum(len(r) > room for r in rows)
    rows = [r[:room] for r in rows]
    vocab = max(model.config.src_vocab_size, model.config.tgt_vocab_size)
    pairs = TokenPairs.from_rows(rows, rows, token_dtype(vocab), length_dtype(room))
    _, nll, n = heldout_loss(model, pairs, task, max(batch_tokens, room + extra), seed, device)
    out = {"task": task, "perplexity": math.exp(nll / max(n, 1)), "nll": nll / max(n, 1), "nll_total": nll,
           "tokens": n, "sentences": len(rows), "truncated": truncated}
    return {**out, "seed": seed} if spec.masked else out


def accuracy(model_dir: str | os.PathLike, path: str | os.PathLike, batch_size: int = 64,
             device: str = "cpu") -> dict[str, Any]:
    """A classifier's accuracy and macro-F1 on a ``text<TAB>label`` file:
    ``{"task": "classify", "accuracy", "macro_f1", "sentences"}``."""
    with Classifier.load(model_dir, Runtime(device=device)) as classifier:
        return {"task": "classify", **score_labelled(classifier, path, batch_size)}


def score_labelled(classifier: "Classifier", path: str | os.PathLike, batch_size: int = 64) -> dict[str, Any]:
    """Accuracy, macro-F1 and sentence count of ``classifier`` on the labels of a ``text<TAB>label``
    file (:func:`~transduce.evaluation.metrics.classification_scores`; ``classify --score``); a
    label the model does not know is a DataError naming its line."""
    examples = read_labelled(path)
    check_labels(examples, classifier.config.labels, path)
    predicted = classifier.classify([text for text, _ in examples], batch_size)
    return classification_scores(predicted, [gold for _, gold in examples])


@torch.no_grad()
def next_sentence_accuracy(model: torch.nn.Module, pairs: "TokenPairs", seed: int = DEFAULT_SEED,
                           batch_size: int = 64) -> float:
    """The share of lines of ``pairs`` (a document's token rows, in order) whose next-sentence
    label the model's head predicts: each line paired with the next or a random one, masked, as
    in training (:func:`~transduce.data.encoder_inputs.next_sentence_batch`), from ``seed``."""
    device = next(model.parameters()).device
    right = 0
    for k, lo in enumerate(range(0, len(pairs), batch_size)):
        batch = next_sentence_batch(pairs, range(lo, min(lo + batch_size, len(pairs))), model.config.max_positions - 2,
                                    model.mask_id, masking_generator(seed, VALID_STREAM, 0, k)).to(device)
        logits = model.next_sentence_logits(model(batch.src, token_types(batch.src)))  # (B, 2)
        right += int((logits.argmax(-1) == batch.next_labels).sum())
    return right / max(len(pairs), 1)
