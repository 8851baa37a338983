"""Repetition controls, the one place every search applies them: n-gram blocking and the
CTRL repetition penalty.

* ``no_repeat_ngram_size`` n: a token that would complete an n-gram already in the output gets
  probability zero (fairseq's ``--no-repeat-ngram-size``, HF's ``no_repeat_ngram_size``, CTranslate2's
  ``no_repeat_ngram_size``). Applied after the log-softmax, so scores stay the model's own.
* ``repetition_penalty`` p: the logit of every token already in the output is multiplied by p
  when negative and divided by p otherwise, before the log-softmax (Keskar et al., 2019,
  https://arxiv.org/abs/1909.05858, Sec. 4.1; as HF and CTranslate2 define it). Scores are then
  the log-probabilities of the penalised distribution, which ``score`` reproduces.

The output so far is a (N, T) history whose first ``length`` positions are written (an int, or a
0-dim device tensor in static decoding, which the host never reads), so eager, static and forced
decoding share this code.

Legend: N decoder rows, T history width, V vocabulary, n the n-gram size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ...config import DecodeConfig


@dataclass(frozen=True)
class Repetition:
    """The repetition settings of a search and the output they look at."""

    history: Tensor       # (N, T) output ids so far (no BOS); positions >= length are ignored
    length: int | Tensor  # written positions of ``history``
    ngram: int            # no_repeat_ngram_size; 0: off
    penalty: float        # repetition_penalty; 1.0: off

    @staticmethod
    def of(decode: DecodeConfig, history: Tensor, length: int | Tensor | None = None) -> "Repetition | None":
        """The controls ``decode`` asks for over ``history`` (default length: all of it); None when
        both are off, so a search without them does no work."""
        if not decode.no_repeat_ngram_size and decode.repetition_penalty == 1.0:
            return None
        length = history.shape[1] if length is None else length
        return Repetition(history, length, decode.no_repeat_ngram_size, decode.repetition_penalty)

    def rows(self, start: int, stop: int) -> "Repetition":
        """The same controls for history rows ``start:stop`` (scoring in blocks of rows)."""
        return Repetition(self.history[start:stop], self.length, self.ngram, self.penalty)

    def _written(self) -> Tensor:
        """(T,) bool: the positions of the history written so far."""
        return torch.arange(self.history.shape[1], device=self.history.device) < self.length

    def penalise(self, logits: Tensor) -> Tensor:
        """CTRL's penalty on the logits of the tokens already output. (N, V) -> (N, V)."""
        if self.penalty == 1.0 or self.history.shape[1] == 0:
            return logits
        count = self._written().long().expand_as(self.history)            # (N, T)
        seen = torch.zeros_like(logits, dtype=torch.long).scatter_add_(1, self.history, count) > 0  # (N, V)
        penalised = torch.where(logits < 0, logits * self.penalty, logits / self.penalty)
        return torch.where(seen, penalised, logits)

    def block(self, logp: Tensor) -> Tensor:
        """-inf for each token that would repeat an n-gram of the history. (N, V) -> (N, V)."""
        n, width = self.ngram, self.history.shape[1]
        if not n or width < n:  # no complete n-gram yet
            return logp
        windows = self.history.unfold(1, n, 1)                            # (N, W, n), W = T - n + 1
        starts = torch.arange(windows.shape[1], device=logp.device)
        whole = starts <= self.length - n                                 # (W,) windows fully written
        tail = (self.length - (n - 1) + torch.arange(n - 1, device=logp.device)).clamp(0, width - 1)
        last = self.history[:, tail]                                      # (N, n-1) the latest n-1 tokens
        match = (windows[:, :, :-1] == last.unsqueeze(1)).all(dim=2) & whole  # (N, W)
        banned = torch.zeros_like(logp, dtype=torch.long).scatter_add_(1, windows[:, :, -1], match.long()) > 0
        return logp.masked_fill(banned, -math.inf)
