"""Validation during training: teacher-forced loss and greedy-decoding BLEU; a classifier's
loss and accuracy. The held-out loop and the metrics are :mod:`transduce.evaluation`'s; the
label-smoothed loss they are given is training's."""

from __future__ import annotations

from functools import partial
from typing import Sequence

import torch
from torch import Tensor

from ..config import RunConfig
from ..data.batch import Batch
from ..data.epoch_batches import token_budget_batches
from ..data.encoder_inputs import classification_batch
from ..data.multilingual import lang_tag, pair_name
from ..data.prepared import TokenPairs
from ..evaluation.heldout import heldout_loss
from ..evaluation.metrics import corpus_bleu
from ..evaluation.text2text import flat_scores, task_scores
from ..inference import Runtime, Translator
from ..model.transformer import Transformer
from .encoder_tasks import classification_loss
from .loss import excluded_class, label_smoothed_loss
from .step import batch_loss, final_states


def validation_loss(model: torch.nn.Module, pairs: TokenPairs, cfg: RunConfig, device: torch.device,
                    sentinels: Sequence[int] = ()) -> tuple[float, float]:
    """Per-token smoothed loss and NLL over ``pairs`` (eval mode, no dropout); for a masked LM
    per selected token, under one fixed masking of each sentence (the same at every validation);
    for span corruption (with ``sentinels``) likewise under one fixed corruption."""
    loss, nll, n = heldout_loss(model, pairs, cfg.task, cfg.data.max_tokens, cfg.train.seed, device,
                                partial(smoothed_batch_loss, smoothing=cfg.train.label_smoothing), sentinels)
    return loss / max(n, 1), nll / max(n, 1)


def smoothed_batch_loss(model: torch.nn.Module, batch: Batch, smoothing: float) -> tuple[Tensor, Tensor, Tensor]:
    """One held-out batch's summed label-smoothed loss, summed NLL and token count
    (:data:`~transduce.evaluation.heldout.BatchLoss`): a masked LM's head on the selected
    positions only, else the output projection then :func:`~.loss.label_smoothed_loss`."""
    if model.config.family.masked_lm:
        out = batch_loss(model, final_states(model, batch), batch, smoothing, model.config.label_pad_id)
    else:
        logits = model.output_proj(final_states(model, batch))           # (B, T, V)
        out = label_smoothed_loss(logits, batch.tgt_out, smoothing, model.config.label_pad_id,
                                  excluded_class(model.config))
    return out.loss, out.nll, out.n_tokens


@torch.no_grad()
def validation_classify(model: torch.nn.Module, pairs: TokenPairs, cfg: RunConfig,
                        device: torch.device) -> dict[str, float]:
    """A classifier's per-sentence smoothed loss and its accuracy over ``pairs`` (eval mode)."""
    plan = token_budget_batches(*pairs.task_lengths("classify"), cfg.data.max_tokens, seed=0, epoch=0,
                                shuffle=False)
    loss, correct = 0.0, 0
    for i in range(len(plan)):
        batch = classification_batch(pairs.batch(plan[i])).to(device)
        logits = model.classify(final_states(model, batch))              # (B, K)
        loss += classification_loss(logits, batch.tgt_out[:, 0], cfg.train.label_smoothing).loss.item()
        correct += int((logits.argmax(-1) == batch.tgt_out[:, 0]).sum())
    return {"val_loss": loss / max(len(pairs), 1), "val_acc": correct / max(len(pairs), 1)}


@torch.no_grad()
def validation_bleu(model: Transformer, tokenizer, texts: list[tuple[str, str]], cfg: RunConfig,
                    device: torch.device) -> dict[str, float]:
    """Corpus BLEU (sacrebleu, default 13a tokenisation) of greedy translations of ``texts``
    (``val_bleu``); for text-to-text data (``data.corpus: tsv``) each task's BLEU or accuracy
    instead (:func:`~transduce.evaluation.text2text.task_scores`: ``val_bleu/TASK``, ``val_acc/TASK``);
    for a multilingual model (``data.pairs``) each language pair's BLEU too (``val_bleu/en-de``)."""
    # (the block's end gives the training model back as it was)
    with Translator(model, tokenizer, Runtime(device=str(device))) as translator:
        hyps = translator.translate([s for s, _ in texts], beam=1, max_len_a=cfg.decode.max_len_a,
                                    max_len_b=cfg.decode.max_len_b, batch_tokens=cfg.decode.batch_tokens)
    if cfg.data.corpus == "tsv":
        return flat_scores(task_scores([s for s, _ in texts], hyps, [t for _, t in texts]))
    if cfg.data.pairs:  # multilingual: each language pair's BLEU, by its tag (val_bleu/en-de), and over all
        names = {lang_tag(p["tgt"]): pair_name(p) for p in cfg.data.pairs}
        scores = task_scores([s for s, _ in texts], hyps, [t for _, t in texts],
                             task=lambda text: names.get(text.split(" ", 1)[0], "other"), metric=lambda _: "bleu")
        return {"val_bleu": corpus_bleu(hyps, [t for _, t in texts]), **flat_scores(scores)}
    return {"val_bleu": corpus_bleu(hyps, [t for _, t in texts])}
