"""One request of the continuous batch: its settings, and the search state that its rows carry.

A request's search runs step by step on the log-probabilities of its own rows, which the
scheduler (:mod:`.scheduler`) hands it each step: greedy search and sampling hold one row,
beam search one row per beam (one before the first step). The beam steps are beam search's own
helpers (:mod:`~transduce.inference.search.beam`: ``candidates``, ``finish``, ``advance``,
``best_of``) run on a batch of one sentence, so a request gets what
:func:`~transduce.inference.search.beam.beam_search` gives its sentence.

Legend: K beam, V vocabulary, S source length.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
from torch import Tensor

from ...config import DecodeConfig, check_sampling
from ...errors import ConfigError
from ..search.beam import advance, best_of, candidates, finish, settled, start
from ..search.common import SearchOutput, topk_rows
from ..search.sampling import filter_logits

_ids = itertools.count()


@dataclass(frozen=True)
class RequestSettings:
    """What one request's search does: its decoding settings (``beam`` 1 is greedy search;
    ``nbest``, ``lenpen``, ``stop``, ``min_len``, the length limit ``max_len_a`` * source length
    + ``max_len_b``) and, with ``temperature`` > 0, sampling (``top_k``, ``top_p``, ``seed`` a
    private generator: the same draws as :meth:`~transduce.inference.Translator.sample` of this
    sentence alone)."""

    decode: DecodeConfig = DecodeConfig()
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def check(self) -> None:
        """A one-line ConfigError for what a step of the continuous batch does not do (those
        requests run on the request-level path: :class:`~transduce.inference.Translator`)."""
        d = self.decode
        if self.temperature:
            check_sampling(self.temperature, self.top_k, self.top_p)
        for key, off in (("no_repeat_ngram_size", d.no_repeat_ngram_size == 0),
                         ("repetition_penalty", d.repetition_penalty == 1.0), ("shortlist", not d.shortlist),
                         ("rerank", d.rerank == "none")):
            if not off:
                raise ConfigError(f"decode.{key}: continuous batching does not apply it; use the request-level "
                                  "path (Translator, serve.batching=request)")
        if d.nbest > d.beam and not self.temperature:
            raise ConfigError(f"decode.nbest: {d.nbest} hypotheses need a beam of at least that many; got {d.beam}")


@dataclass
class Result:
    """A finished request: its hypotheses (target ids, EOS included when it ended), best first,
    their ranking scores and log-probabilities (as :class:`~transduce.inference.search.common.SearchOutput`)."""

    tokens: list[list[int]]
    scores: list[float]
    log_probs: list[float]


@dataclass(eq=False)
class Request:
    """A source (ids + EOS) to translate with ``settings``; ``on_done`` gets the :class:`Result`
    or the exception that ended it, ``on_tokens`` (optional) each step's settled tokens."""

    src: list[int]
    settings: RequestSettings
    on_done: Callable[[Result | BaseException], None]
    on_tokens: Callable[[list[int]], None] | None = None
    id: int = field(default_factory=lambda: next(_ids))
    arrived: float = field(default_factory=time.monotonic)
    cancelled: bool = False
    limit: int = 0                    # output length limit, set on admission
    steps: int = 0                    # steps decoded so far
    row0: int = 0                     # its first row in the running batch
    next_rows: list[int] = field(default_factory=list)  # the rows its next step continues (none: it left)
    run: "SequentialRun | BeamRun | None" = None

    @property
    def width(self) -> int:
        """Rows the request holds once its search is under way (its beams)."""
        return 1 if self.settings.temperature else self.settings.decode.beam


class SequentialRun:
    """Greedy search or sampling of one request: one row, a token per step."""

    rows = 1

    def __init__(self, request: Request, eos_id: int, device: torch.device):
        s = request.settings
        self.limit, self.eos_id, self.temperature = request.limit, eos_id, s.temperature
        self.top_k, self.top_p = s.top_k, s.top_p
        self.generator = None
        if s.temperature and s.seed is not None:
            self.generator = torch.Generator(device=device).manual_seed(s.seed)
        self.tokens: list[int] = []
        self.log_prob = np.float32(0.0)   # summed in float32, as the searches' own sums are
        self.last: Tensor | None = None   # (1,) the token fed to the next step

    def sample(self, logp: Tensor) -> Tensor:
        """Draw this step's token from its row's log-probs (1, V) -> (1,) (sampling's choice)."""
        probs = filter_logits(logp, self.temperature, self.top_k, self.top_p).exp()  # (1, V)
        return torch.multinomial(probs, 1, generator=self.generator).squeeze(1)

    def take(self, token: int, token_logp: float, last: Tensor) -> bool:
        """Record this step's token; whether the request is done (EOS, or its length limit)."""
        self.tokens.append(token)
        self.log_prob = self.log_prob + np.float32(token_logp)
        self.last = last
        return token == self.eos_id or len(self.tokens) >= self.limit

    def settled(self) -> list[int]:
        return list(self.tokens)

    def result(self) -> Result:
        return Result([list(self.tokens)], [float(self.log_prob)], [float(self.log_prob)])


class BeamRun:
    """Beam search of one request: beam search's state for a batch of one sentence."""

    def __init__(self, request: Request, src: Tensor, config: object):
        d = request.settings.decode
        self.decode, self.config = d, config
        self.beams, self.fin = start(src, d.beam, config, d.max_len_a, d.max_len_b, False)
        self.beams.limit = torch.full_like(self.beams.limit, request.limit)

    @property
    def rows(self) -> int:
        return self.beams.scores.numel()

    @property
    def last(self) -> Tensor:
        return self.beams.tokens[0, :, -1]                                # (k,)

    def advance(self, logp: Tensor, step: int) -> tuple[list[int], bool]:
        """One step on its rows' log-probs (k, V): the rows (0..k-1) the next step's beams
        continue, and whether the request is done (beam search's ``stop`` rule)."""
        d, cfg = self.decode, self.config
        cand = candidates(*topk_rows(logp, min(2 * d.beam, logp.shape[-1])), self.beams, d.beam, step, cfg.eos_id)
        if bool(cand.ends.any()):
            finish(self.fin, self.beams, cand, step, d.lenpen, cfg.pad_id, None)
        self.beams, rows = advance(self.beams, cand, d.beam, None)
        if d.stop == "k_finished":
            done = bool(self.fin.count[0] >= d.beam)
        else:
            done = bool(self.fin.best_ended[0] & (self.fin.count[0] >= d.nbest))
        return rows.tolist(), done or step + 1 >= self.fin.tokens.shape[2]

    def settled(self) -> list[int]:
        tokens, lengths = settled(self.beams, self.fin)
        return tokens[0, : int(lengths[0])].tolist()

    def result(self) -> Result:
        out: SearchOutput = best_of(self.fin, self.decode.nbest)
        tokens, lengths, scores, log_probs = out.rows()[0]
        hyps = [(t[:n], s, lp) for t, n, s, lp in zip(tokens, lengths, scores, log_probs)]
        kept = [h for i, h in enumerate(hyps) if i == 0 or h[1] != float("-inf")]
        return Result([h[0] for h in kept], [h[1] for h in kept], [h[2] for h in kept])
