"""Validation during training: teacher-forced loss and greedy-decoding BLEU."""

from __future__ import annotations

import torch

from ..config import RunConfig
from ..data.batching import token_budget_batches
from ..data.prepared import TokenPairs
from ..model.transformer import Transformer
from .loss import label_smoothed_loss


@torch.no_grad()
def validation_loss(model: Transformer, pairs: TokenPairs, cfg: RunConfig,
                    device: torch.device) -> tuple[float, float]:
    """Per-token smoothed loss and NLL over ``pairs`` (eval mode, no dropout)."""
    plan = token_budget_batches(pairs.src_lens, pairs.tgt_lens, cfg.data.max_tokens, seed=0, epoch=0, shuffle=False)
    loss = nll = 0.0
    n = 0
    for i in range(len(plan)):
        batch = pairs.batch(plan[i]).to(device)
        out = label_smoothed_loss(model(batch.src, batch.tgt_in), batch.tgt_out, cfg.train.label_smoothing,
                                  model.config.pad_id)
        loss, nll, n = loss + out.loss.item(), nll + out.nll.item(), n + int(out.n_tokens)
    return loss / max(n, 1), nll / max(n, 1)


@torch.no_grad()
def validation_bleu(model: Transformer, tokenizer, texts: list[tuple[str, str]], cfg: RunConfig,
                    device: torch.device) -> float:
    """Corpus BLEU (sacrebleu, default 13a tokenisation) of greedy translations of ``texts``."""
    from ..evaluation.metrics import corpus_bleu
    from ..inference.translator import Translator
    with Translator(model, tokenizer, device=device) as translator:  # gives the training model back as it was
        hyps = translator.translate([s for s, _ in texts], beam=1, max_len_a=cfg.decode.max_len_a,
                                    max_len_b=cfg.decode.max_len_b, batch_tokens=cfg.decode.batch_tokens)
    return corpus_bleu(hyps, [t for _, t in texts])
