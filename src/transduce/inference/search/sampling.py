"""Ancestral sampling with temperature, top-k (Fan et al., 2018, https://arxiv.org/abs/1805.04833)
and nucleus / top-p (Holtzman et al., 2020, https://arxiv.org/abs/1904.09751) filtering.

Sampling reuses the left-to-right loop of greedy search (:func:`sequential_search`); only the
token choice differs. A ``seed`` gives a private generator, so results are reproducible and
the global RNG is untouched.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ...config import DecodeConfig, check_sampling
from .common import AttentionChoice, Seq2Seq, SearchOutput, step_log_probs
from .greedy import sequential_search
from .repetition import Repetition


def filter_logits(logp: Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """Scale by 1 / temperature, keep the ``top_k`` best and the smallest set of tokens whose
    probability reaches ``top_p``; the rest get -inf. (N, V) -> (N, V) log-probs.

    ``top_k=0`` and ``top_p=1.0`` disable the filters. The most probable token always survives.
    """
    logp = torch.log_softmax(logp if temperature == 1 else logp / temperature, dim=-1)  # (x / 1 is x)
    if 0 < top_k < logp.shape[-1]:
        kth = logp.topk(top_k, dim=-1).values[:, -1:]                    # (N, 1)
        logp = logp.masked_fill(logp < kth, -math.inf)
    if top_p < 1.0:
        sorted_logp, order = logp.sort(dim=-1, descending=True)          # (N, V)
        mass_before = sorted_logp.exp().cumsum(dim=-1) - sorted_logp.exp()
        drop_sorted = mass_before >= top_p                                # keeps the first token
        drop = drop_sorted.scatter(1, order, drop_sorted)
        logp = logp.masked_fill(drop, -math.inf)
    return logp


def sample(
    model: Seq2Seq, src: Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
    seed: int | None = None, decode: DecodeConfig = DecodeConfig(), attention: AttentionChoice | None = None,
) -> SearchOutput:
    """Draw one output per sentence, token by token, from the filtered model distribution.

    Args:
        model: as :func:`~transduce.inference.search.greedy.greedy_search`.
        src: as :func:`~transduce.inference.search.greedy.greedy_search`.
        decode: as :func:`~transduce.inference.search.greedy.greedy_search` (with its repetition controls).
        attention: as :func:`~transduce.inference.search.greedy.greedy_search`.
        temperature: divides the logits; < 1 sharpens, > 1 flattens.
        top_k: sample among the k most probable tokens only (0 = all).
        top_p: sample among the most probable tokens covering this mass (1.0 = all).
        seed: seeds a private generator; None uses the global RNG.

    Returns:
        :class:`SearchOutput` with K = 1; scores are log-probabilities under the unfiltered model.
    """
    check_sampling(temperature, top_k, top_p)
    generator = None
    if seed is not None:
        generator = torch.Generator(device=src.device).manual_seed(seed)

    cfg = model.config

    def choose(states: Tensor, step: int, forced: Tensor | None, repeat: Repetition | None) -> tuple[Tensor, Tensor]:
        logp = step_log_probs(model.output_proj(states), cfg, step, decode.min_len, repeat=repeat)  # (N, V)
        probs = filter_logits(logp, temperature, top_k, top_p).exp()     # (N, V)
        token = torch.multinomial(probs, 1, generator=generator)         # (N, 1)
        return token.squeeze(1), logp.gather(1, token).squeeze(1)

    return sequential_search(model, src, choose, decode, attention)
