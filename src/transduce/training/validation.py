"""Validation during training: teacher-forced loss and greedy-decoding BLEU; a classifier's
loss and accuracy."""

from __future__ import annotations

from typing import Sequence

import torch

from ..config import RunConfig
from ..data.batching import token_budget_batches
from ..data.encoder_inputs import VALID_STREAM, classification_batch, masked_batch, masking_generator
from ..data.prepared import TokenPairs
from ..errors import DataError
from ..model.transformer import Transformer
from .encoder_tasks import classification_loss
from .loss import label_smoothed_loss
from .step import batch_loss, final_states, unwrapped


def validation_loss(model: torch.nn.Module, pairs: TokenPairs, cfg: RunConfig,
                    device: torch.device) -> tuple[float, float]:
    """Per-token smoothed loss and NLL over ``pairs`` (eval mode, no dropout); for a masked LM
    per selected token, under one fixed masking of each sentence (the same at every validation)."""
    loss, nll, n = heldout_loss(model, pairs, cfg.task, cfg.data.max_tokens, cfg.train.seed, device,
                                cfg.train.label_smoothing)
    return loss / max(n, 1), nll / max(n, 1)


@torch.no_grad()
def heldout_loss(model: torch.nn.Module, pairs: TokenPairs, task: str, max_tokens: int, seed: int,
                 device: torch.device, smoothing: float = 0.0) -> tuple[float, float, int]:
    """Summed smoothed loss and NLL of held-out ``pairs`` and the token count they are over
    (``task`` translation or lm: every target token and EOS; mlm: the selected tokens, sentence
    ``j`` masked by the key (seed, VALID_STREAM, 0, j)), batched by ``max_tokens``. Batching
    does not change the sums (up to float rounding)."""
    plan = token_budget_batches(*pairs.task_lengths(task), max_tokens, seed=0, epoch=0, shuffle=False)
    loss = nll = 0.0
    n = 0
    for i in range(len(plan)):
        batch = pairs.batch(plan[i])
        if task == "mlm":
            keys = [masking_generator(seed, VALID_STREAM, 0, int(j)) for j in plan[i]]
            batch = masked_batch(batch, unwrapped(model).mask_id, keys).to(device)
            out = batch_loss(model, final_states(model, batch), batch, smoothing, model.config.pad_id)
        else:
            batch = batch.to(device)
            logits = model.output_proj(final_states(model, batch))           # (B, T, V)
            out = label_smoothed_loss(logits, batch.tgt_out, smoothing, model.config.pad_id)
        loss, nll, n = loss + out.loss.item(), nll + out.nll.item(), n + int(out.n_tokens)
    return loss, nll, n


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
                    device: torch.device) -> float:
    """Corpus BLEU (sacrebleu, default 13a tokenisation) of greedy translations of ``texts``."""
    from ..inference.translator import Translator
    with Translator(model, tokenizer, device=device) as translator:  # gives the training model back as it was
        hyps = translator.translate([s for s, _ in texts], beam=1, max_len_a=cfg.decode.max_len_a,
                                    max_len_b=cfg.decode.max_len_b, batch_tokens=cfg.decode.batch_tokens)
    return corpus_bleu(hyps, [t for _, t in texts])


def corpus_bleu(hyps: Sequence[str], refs: Sequence[str]) -> float:
    """sacrebleu corpus BLEU (default 13a tokenization, case-sensitive), 0-100: validation's one
    number (``transduce evaluate`` reports more, :func:`transduce.evaluation.score`). Here, not in
    :mod:`transduce.evaluation`, which scores saved models with this package's held-out loss."""
    from sacrebleu.metrics import BLEU

    if len(hyps) != len(refs):
        raise DataError(f"{len(hyps)} hypotheses but {len(refs)} references")
    return float(BLEU().corpus_score(list(hyps), [list(refs)]).score)
