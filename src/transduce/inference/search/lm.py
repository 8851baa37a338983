"""Continuing prompts with a decoder-only language model, one token at a time (greedy or
sampled), over the KV cache: what :class:`~transduce.inference.Generator` runs.

Conventions and legend: :mod:`.common`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..speed import new_cache, prepared
from .common import step_log_probs
from .sampling import filter_logits


@torch.no_grad()  # generation never needs gradients (and the pooled cache forbids them)
def generate_ids(model: torch.nn.Module, prompts: Tensor, gen,
                 generator: torch.Generator | None = None) -> list[list[int]]:
    """Continue each row of ``prompts`` (B, P), BOS first, all of one length, as ``gen`` (a
    :class:`~transduce.config.GenerationConfig`) says; returns the new ids of each row (without
    EOS), at most ``max_new_tokens`` and never past ``max_positions``. Sampling draws from
    ``generator``; without one, from a generator seeded by ``gen.seed`` when set (else the global RNG).

    The model runs prepared for decoding (:func:`~transduce.inference.speed.prepared`: projections
    fused once, the pooled cache, few-query attention), as search does; only the last position of
    the prompt is projected to the vocabulary.
    """
    if generator is None and gen.seed is not None:
        generator = torch.Generator(device=prompts.device).manual_seed(gen.seed)
    with prepared(model):
        return _generate_ids(model, prompts, gen, generator)


def _generate_ids(model: torch.nn.Module, prompts: Tensor, gen,
                  generator: torch.Generator | None) -> list[list[int]]:
    cfg = model.config
    steps = min(gen.max_new_tokens, cfg.max_positions - prompts.shape[1])
    cache = new_cache(model)
    states = model.decode(prompts, cache, project=False).states[:, -1]  # (B, D)
    logits = model.output_proj(states)                                  # (B, V)
    done = torch.zeros(prompts.shape[0], dtype=torch.bool, device=prompts.device)
    new: list[Tensor] = []
    for step in range(steps):
        logp = step_log_probs(logits, cfg, step, gen.min_new_tokens)      # (B, V), no PAD or BOS
        if gen.temperature == 0:
            token = logp.argmax(dim=-1)                                   # (B,)
        else:
            probs = filter_logits(logp, gen.temperature, gen.top_k, gen.top_p).exp()
            token = torch.multinomial(probs, 1, generator=generator).squeeze(1)
        token = token.masked_fill(done, cfg.eos_id)
        new.append(token)
        done |= token == cfg.eos_id
        if step == steps - 1 or bool(done.all()):
            break
        logits = model.decode(token[:, None], cache).logits[:, -1]
    rows = torch.stack(new, dim=1).tolist() if new else [[] for _ in range(len(prompts))]
    return [row[:row.index(cfg.eos_id)] if cfg.eos_id in row else row for row in rows]
