"""Validation during training: teacher-forced loss and greedy-decoding BLEU."""

from __future__ import annotations

import torch

from ..config import RunConfig
from ..data.batching import token_budget_batches
from ..data.prepared import TokenPairs
from ..model.transformer import Transformer
from .loss import label_smoothed_loss
from .step import final_states


@torch.no_grad()
def validation_loss(model: torch.nn.Module, pairs: TokenPairs, cfg: RunConfig,
                    device: torch.device) -> tuple[float, float]:
    """Per-token smoothed loss and NLL over ``pairs`` (eval mode, no dropout)."""
    src_lens = pairs.tgt_lens if cfg.task == "lm" else pairs.src_lens  # an LM reads only the target side
    plan = token_budget_batches(src_lens, pairs.tgt_lens, cfg.data.max_tokens, seed=0, epoch=0, shuffle=False)
    loss = nll = 0.0
    n = 0
    for i in range(len(plan)):
        batch = pairs.batch(plan[i]).to(device)
        logits = model.output_proj(final_states(model, batch))           # (B, T, V)
        out = label_smoothed_loss(logits, batch.tgt_out, cfg.train.label_smoothing, model.config.pad_id)
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
