"""The step-level scheduler of continuous batching: requests join the running batch at the next
decoding step and leave it as soon as they finish.

Each :meth:`Scheduler.step`:

1. drops cancelled requests and admits waiting ones (FIFO under a :class:`Budget` of rows and
   cached positions; a request that does not fit lets later, smaller ones pass until it has
   waited ``max_wait_ms``, then nothing passes it);
2. encodes the admitted sources as one batch and projects their cross-attention keys/values;
3. rebuilds the cache (:class:`~.cache.RowKVCache`) only if rows left, joined or were reordered
   by a beam step: kept rows first, in order, then the joining ones;
4. runs ``model.decode`` once for every row (the model's own layers, each row at its own
   position), then each request's search on its rows' log-probabilities
   (:mod:`.requests`): greedy tokens for all greedy rows at once, each sampled or beam request
   on its own rows.

The scheduler is single-threaded; :class:`~.front.ContinuousTranslator` runs it in one thread
and takes submissions from any.

Legend: N rows, B joining requests, S source length, D d_model, V vocabulary.
"""

from __future__ import annotations

import collections
import logging
import math
import time
from dataclasses import dataclass

import torch
from torch import Tensor

from ...errors import ConfigError
from ...model.embeddings import SinusoidalPositions
from ...model.transformer import EncoderOutput, Transformer
from ..search.common import max_lengths, step_log_probs
from .cache import RowKVCache
from .requests import BeamRun, Request, SequentialRun

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Budget:
    """What the running batch may hold: ``max_rows`` decoder rows (a request takes its beam
    size) and ``max_tokens`` cached positions (rows x (output limit + source length), the most
    a request can hold); ``max_wait_ms``: how long the oldest waiting request may be passed by
    later ones that fit. A request larger than the whole budget runs once the batch is empty."""

    max_rows: int = 256
    max_tokens: int = 262_144
    max_wait_ms: float = 200.0

    def __post_init__(self):
        if self.max_rows < 1 or self.max_tokens < 1 or self.max_wait_ms < 0:
            raise ConfigError(f"budget: max_rows and max_tokens must be >= 1 and max_wait_ms >= 0; got {self}")


def unsupported(model: torch.nn.Module) -> str | None:
    """Why ``model``'s decoder cannot run rows at different positions (None: it can): the
    continuous batch needs a :class:`~transduce.model.Transformer` with absolute positions
    (sinusoidal or learned) and full self- and cross-attention in the decoder."""
    if not isinstance(model, Transformer):
        return f"continuous batching runs one Transformer, not {type(model).__name__} (ensembles: request batching)"
    if model.config.positions not in ("sinusoidal", "learned"):
        return f"continuous batching needs absolute positions; this model has model.positions={model.config.positions}"
    for layer in model.decoder_layers:
        if not (layer.self_attn.is_full and (layer.cross_attn is None or layer.cross_attn.is_full)):
            return "continuous batching needs full attention in the decoder (model.attention / cross_attention)"
    return None


def cost(request: Request) -> tuple[int, int]:
    """The rows and cached positions a request may hold: its beams, each up to its output limit
    plus its source."""
    return request.width, request.width * (request.limit + len(request.src))


class Scheduler:
    """Continuous batching of encoder-decoder searches over one model (see the module doc).

    Args:
        model: an eval-mode :class:`~transduce.model.Transformer` (prepared for decoding or not);
            :func:`unsupported` says which ones.
        budget: the batch's limits (:class:`Budget`).
        device: where the batch lives (the model's).
    """

    def __init__(self, model: torch.nn.Module, budget: Budget = Budget(), device: torch.device | str = "cpu"):
        why = unsupported(model)
        if why is not None:
            raise ConfigError(why)
        self.model, self.budget, self.device = model, budget, torch.device(device)
        self.config = model.config
        self.waiting: collections.deque[Request] = collections.deque()
        self.active: list[Request] = []
        self.cache: RowKVCache | None = None
        self.tokens, self.steps, self.finished = 0, 0, 0
        self._rows = 0

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.active)

    @property
    def rows(self) -> int:
        """Rows held by running requests (what the next step continues)."""
        return self._rows

    def add(self, request: Request) -> None:
        """Queue a request (its settings already checked); it joins at a later step."""
        d = request.settings.decode
        src = torch.tensor([request.src])
        request.limit = int(max_lengths(src, self.config, d.max_len_a, d.max_len_b)[0])
        positions = getattr(self.model.tgt_embed, "positions", None)
        if isinstance(positions, SinusoidalPositions):  # the table grows on an int read, never on a row's
            positions(0, request.limit + 1)
        self.waiting.append(request)

    def step(self) -> int:
        """Admit, decode one step for every row, advance each request; -> the rows decoded."""
        with torch.inference_mode():
            joining = self._admit()
            self._rebuild(joining)
            if not self.active:
                self._rows = 0
                return 0
            n = self.cache.rows
            try:
                logp = self._decode()
            except Exception as e:  # noqa: BLE001 - the batch fails, the scheduler goes on
                logger.exception("a step of %d rows failed", n)
                for r in self.active:
                    r.on_done(e)
                self.active, self.cache, self._rows = [], None, 0
                return 0
            answers = self._advance(logp)
            self._rows = sum(len(r.next_rows) for r in self.active)
            if not self._rows:  # all left: hold no rows while idle
                self.active, self.cache = [], None
            for r, outcome in answers:  # after the bookkeeping: an answer may be read at once
                r.on_done(outcome)
        self.steps += 1
        self.tokens += n
        return n

    def fail_all(self, error: BaseException) -> None:
        """End every waiting and running request with ``error`` (shutdown)."""
        for r in [*self.waiting, *self.active]:
            r.on_done(error)
        self.waiting.clear()
        self.active, self.cache, self._rows = [], None, 0

    def _admit(self) -> list[Request]:
        """The waiting requests that join now, FIFO within the budget (see :class:`Budget`)."""
        rows = sum(cost(r)[0] for r in self.active)
        tokens = sum(cost(r)[1] for r in self.active)
        chosen, now = [], time.monotonic()
        for r in list(self.waiting):
            if r.cancelled:
                self.waiting.remove(r)
                r.on_done(CancelledRequest("cancelled before it started"))
                continue
            need_rows, need_tokens = cost(r)
            alone = not self.active and not chosen
            if alone or (rows + need_rows <= self.budget.max_rows and tokens + need_tokens <= self.budget.max_tokens):
                self.waiting.remove(r)
                chosen.append(r)
                rows, tokens = rows + need_rows, tokens + need_tokens
            elif (now - r.arrived) * 1000.0 >= self.budget.max_wait_ms:
                break  # it has waited long enough: nothing later passes it
        return chosen

    def _rebuild(self, joining: list[Request]) -> None:
        """The next step's batch: kept rows of the running requests, then the joining ones."""
        kept, keep, cross_keep = [], [], []
        for r in self.active:
            if not r.next_rows:  # finished (or failed) last step
                continue
            if r.cancelled:
                r.on_done(CancelledRequest("cancelled"))
                continue
            kept.append(r)
            keep += r.next_rows
            cross_keep += [r.row0] * len(r.next_rows)
        new = None
        if joining:
            try:
                new = self._encode(joining)
            except Exception as e:  # noqa: BLE001 - the joining requests fail, the running batch goes on
                logger.exception("encoding %d joining requests failed", len(joining))
                for r in joining:
                    r.on_done(e)
                joining = []
        if self.cache is None or not keep:
            self.cache = new
        elif new is not None or keep != list(range(self.cache.rows)):
            self.cache = self.cache.regather(keep, cross_keep, new)
        self.active = kept + joining
        row = 0
        for r in self.active:
            r.row0, row = row, row + r.run.rows
        self.last = torch.cat([r.run.last for r in self.active]).unsqueeze(1) if self.active else None  # (N, 1)

    def _encode(self, joining: list[Request]) -> RowKVCache:
        """Encode the joining sources as one batch; their runs and their rows' cache."""
        pad = self.config.pad_id
        width = max(len(r.src) for r in joining)
        src = torch.tensor([r.src + [pad] * (width - len(r.src)) for r in joining], device=self.device)  # (B, S)
        enc = self.model.encode(src)
        cross = [layer.cross_attn.project_kv(enc.memory) for layer in self.model.decoder_layers]  # (B, H, S, Dh) each
        bos = torch.full((1,), self.config.bos_id, dtype=torch.long, device=self.device)
        for i, r in enumerate(joining):
            if r.width > 1:
                r.run = BeamRun(r, src[i:i + 1, :len(r.src)], self.config)
            else:
                r.run = SequentialRun(r, self.config.eos_id, self.device)
                r.run.last = bos
            r.next_rows, r.steps = [], 0
        return RowKVCache.start(cross, enc.mask, [len(r.src) for r in joining])

    def _decode(self) -> Tensor:
        """One decoder step for every row -> log-probs (N, V), EOS forbidden in the rows of
        requests still short of their ``min_len``."""
        cache = self.cache
        cache.ready()
        # cross keys/values are the cache's; the memory itself is not read again
        enc = EncoderOutput(cache.cross_mask.new_zeros(cache.rows, 0, 0, dtype=torch.float32), cache.cross_mask)
        out = self.model.decode(self.last, enc, cache, project=False)
        cache.stepped()
        logp = step_log_probs(self.model.output_proj(out.states[:, -1]), self.config, 0, 0)  # (N, V)
        early = [row for r in self.active if r.steps < r.settings.decode.min_len
                 for row in range(r.row0, r.row0 + r.run.rows)]
        if early:
            logp[torch.tensor(early, device=logp.device), self.config.eos_id] = -math.inf
        return logp

    def _advance(self, logp: Tensor) -> list[tuple[Request, object]]:
        """Each request's search on its rows; -> the answers of those that finished (or failed)."""
        sequential = [r for r in self.active if isinstance(r.run, SequentialRun)]
        if sequential:
            token = logp.max(dim=1).indices                               # (N,) greedy rows' choice
            for r in sequential:
                if r.settings.temperature:
                    token[r.row0:r.row0 + 1] = r.run.sample(logp[r.row0:r.row0 + 1])
            token_logp = logp.gather(1, token.unsqueeze(1)).squeeze(1)    # (N,)
            tokens, logps = token.tolist(), token_logp.tolist()  # the step's one read for them
        answers = []
        for r in self.active:
            try:
                if isinstance(r.run, SequentialRun):
                    done = r.run.take(tokens[r.row0], logps[r.row0], token[r.row0:r.row0 + 1])
                    parents = [0]
                else:
                    parents, done = r.run.advance(logp[r.row0:r.row0 + r.run.rows], r.steps)
                r.steps += 1
                r.next_rows = [] if done else [r.row0 + p for p in parents]
                if r.on_tokens is not None:
                    r.on_tokens(r.run.settled())
                if done:
                    self.finished += 1
                    answers.append((r, r.run.result()))
            except Exception as e:  # noqa: BLE001 - one request fails, the batch goes on
                logger.exception("request %d failed", r.id)
                r.next_rows = []
                answers.append((r, e))
        return answers


class CancelledRequest(Exception):
    """A request's client cancelled it (or went away); its rows were freed."""
