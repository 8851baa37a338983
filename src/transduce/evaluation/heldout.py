"""Scores of a language model, masked LM or classifier on a held-out file (``transduce evaluate``
for ``train.task`` lm, mlm and classify; translation models are scored by :mod:`.metrics`).

- lm: perplexity exp(NLL / tokens) of each line's tokens and EOS given BOS and the tokens before;
- mlm: the same over BERT's masked tokens, each line masked by a seeded key of its own (the
  validation code's masking, :func:`~transduce.training.validation.heldout_loss`), so the figure
  depends on the seed but not on the batching;
- classify: accuracy and macro-F1 of a ``text<TAB>label`` file
  (:func:`score_labelled`, as ``classify --score``).
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any

from ..config import TrainConfig, model_task
from ..errors import ConfigError, DataError
from .metrics import classification_scores

if TYPE_CHECKING:
    from ..inference.classify import Classifier

DEFAULT_SEED = TrainConfig.seed  # a default run's validation masking
_READS = {"lm": ("tgt", 1), "mlm": ("src", 2)}  # side of the tokenizer, positions beside the tokens (BOS, EOS)


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
    from ..data.corpus import read_lines
    from ..data.prepared import TokenPairs, length_dtype, token_dtype
    from ..data.tokenizer import Tokenizer
    from ..device import resolve_device
    from ..model.io import load_model, load_model_config
    from ..training.validation import heldout_loss

    task = model_task(load_model_config(model_dir))
    if task not in _READS:
        raise ConfigError(f"{model_dir}: perplexity is for train.task lm or mlm models; this one is {task}")
    if batch_tokens < 1:
        raise ConfigError(f"decode.batch_tokens: must be positive; got {batch_tokens}")
    side, extra = _READS[task]
    device = resolve_device(device)
    model, tokenizer = load_model(model_dir, device), Tokenizer.load(model_dir)
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
    return {**out, "seed": seed} if task == "mlm" else out


def accuracy(model_dir: str | os.PathLike, path: str | os.PathLike, batch_size: int = 64,
             device: str = "cpu") -> dict[str, Any]:
    """A classifier's accuracy and macro-F1 on a ``text<TAB>label`` file:
    ``{"task": "classify", "accuracy", "macro_f1", "sentences"}``."""
    from ..inference import Classifier, Runtime
    with Classifier.load(model_dir, Runtime(device=device)) as classifier:
        return {"task": "classify", **score_labelled(classifier, path, batch_size)}


def score_labelled(classifier: "Classifier", path: str | os.PathLike, batch_size: int = 64) -> dict[str, Any]:
    """Accuracy, macro-F1 and sentence count of ``classifier`` on the labels of a ``text<TAB>label``
    file (:func:`~transduce.evaluation.metrics.classification_scores`; ``classify --score``); a
    label the model does not know is a DataError naming its line."""
    from ..data.labelled import check_labels, read_labelled
    examples = read_labelled(path)
    check_labels(examples, classifier.config.labels, path)
    predicted = classifier.classify([text for text, _ in examples], batch_size)
    return classification_scores(predicted, [gold for _, gold in examples])
