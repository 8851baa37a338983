"""Lexically constrained beam search: dynamic beam allocation (Post & Vilar, 2018,
https://arxiv.org/abs/1804.06609), batched as in Hu et al. (2019, https://aclanthology.org/N19-1090).

Each sentence has target phrases that must appear in its output (any order). A hypothesis'
*progress* is the number of constraint tokens it has produced: those of the phrases it
completed plus those of the phrase it is in the middle of. At each step the candidates are each
beam's best 2K tokens plus, per beam, the next token of every constraint it could continue or
start (so a constraint can always be pushed into the beam, however improbable). The K beams
are then shared out among the progress levels (*banks*) round-robin, fullest bank first (as
fairseq's ``--constraints``): the best candidate of each bank, then the second best of each,
and so on. A hypothesis may end (EOS, or its length limit) only once every constraint is met;
scores stay the model's own log-probabilities. A phrase interrupted part-way is dropped back to
not started (a token that repeats the phrase's own beginning may restart it, as fairseq).

Each constraint appears once per time it is given: a phrase given twice is two constraints,
both to be met. Once every copy of a phrase is met, the token that would complete it again (its
last token, where the output ends with the rest of it) is refused (:meth:`ConstraintBeams.repeats`),
unless that token starts or continues a phrase not yet met (a met "Haus" does not stop "großes
Haus").

Constraints are whole words: given the table of the pieces that continue a word (``inside``,
:func:`~transduce.data.alignments.word_continuations`), a hypothesis that has just completed a
phrase may not go on with one of them (``▁Hund`` + ``es`` would meet the constraint "Hund" as
tokens and miss it as a word), unless that piece advances a phrase not yet met; punctuation and
EOS stay allowed. Without the table the constraints are token sequences.

:func:`~transduce.inference.search.beam.beam_search` runs it through two hooks:
:meth:`ConstraintBeams.candidates` instead of the plain candidates, and
:meth:`ConstraintBeams.advanced` when the beams are reordered. Without constraints beam search
does none of this and its output is unchanged.

Legend: B active sentences, K beam, N = B*k rows, C constraints per sentence (padded), L
longest phrase, V vocabulary, w = min(2K, V) best tokens per row, M candidates per sentence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ...errors import ConfigError
from .beam import Beams, Candidates
from .common import BlockHook


def constraint_ids(phrases: list[list[list[int]]], device: torch.device | str = "cpu") -> Tensor | None:
    """(B, C, L) constraint ids, -1-padded, from each sentence's list of phrases (token id
    lists); None when no sentence has one."""
    c = max((len(p) for p in phrases), default=0)
    length = max((len(ids) for p in phrases for ids in p), default=0)
    if c == 0 or length == 0:
        return None
    out = torch.full((len(phrases), c, length), -1, dtype=torch.long)
    for i, sentence in enumerate(phrases):
        for j, ids in enumerate(sentence):
            out[i, j, : len(ids)] = torch.tensor(ids, dtype=torch.long)
    return out.to(device)


def check_fits(constraints: Tensor, limit: Tensor) -> None:
    """A one-line ConfigError when a sentence's constraints need more tokens than its output
    limit (``limit`` (B,), :func:`~transduce.inference.search.common.max_lengths`)."""
    need = (constraints >= 0).sum(dim=(1, 2))                             # (B,)
    over = (need > limit).nonzero()
    if over.numel():
        i = int(over[0])
        raise ConfigError(f"constraints: sentence {i + 1} needs {int(need[i])} tokens for its constraints, more than "
                          f"its output limit of {int(limit[i])} (decode.max_len_a * source length + decode.max_len_b)")


@dataclass
class ConstraintBeams:
    """Each alive hypothesis' progress through its sentence's constraints."""

    phrases: Tensor  # (B0, C, L) every input sentence's constraint ids, -1-padded
    copies: Tensor   # (B0, C, C) bool: phrases i and j of a sentence are the same (set up once)
    met: Tensor      # (N, C) bool: phrases completed
    cur: Tensor      # (N,) the phrase in progress, -1: none
    done: Tensor     # (N,) its tokens produced so far
    inside: Tensor | None = None  # (V,) bool: the pieces that continue a word; None: token-level constraints
    closed: Tensor | None = None  # (N,) bool: the last token completed a phrase (with ``inside``)
    # each candidate's progress, kept by :meth:`candidates` for :meth:`advanced`: the (N, m) tokens
    # of each row and, after each, met (N*m, C), cur (N*m,), done (N*m,)
    grown: tuple[Tensor, Tensor, Tensor, Tensor] | None = None

    @staticmethod
    def start(phrases: Tensor, inside: Tensor | None = None) -> "ConstraintBeams":
        """One hypothesis (BOS) per sentence, nothing met; with ``inside`` (V,) bool, phrases
        are whole words (see the module doc)."""
        b, c, _ = phrases.shape
        device = phrases.device
        closed = None if inside is None else torch.zeros(b, dtype=torch.bool, device=device)
        copies = (phrases.unsqueeze(2) == phrases.unsqueeze(1)).all(dim=3)  # (B0, C, C)
        return ConstraintBeams(phrases, copies, torch.zeros(b, c, dtype=torch.bool, device=device),
                               torch.full((b,), -1, device=device), torch.zeros(b, dtype=torch.long, device=device),
                               inside, closed)

    def sentence_rows(self, ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The phrases (N, C, L), their lengths (N, C) and copies (N, C, C) of each row, from its
        sentence's ``ids``."""
        k = self.met.shape[0] // ids.shape[0]
        rows = self.phrases[ids].repeat_interleave(k, dim=0)
        return rows, (rows >= 0).sum(dim=2), self.copies[ids].repeat_interleave(k, dim=0)

    @staticmethod
    def all_met(lengths: Tensor, met: Tensor) -> Tensor:
        """(N,) bool: every (non-empty) phrase met."""
        return (met | (lengths == 0)).all(dim=1)

    @staticmethod
    def progress(lengths: Tensor, met: Tensor, done: Tensor) -> Tensor:
        """(N,) constraint tokens produced: completed phrases plus the one in progress."""
        return (lengths * met).sum(dim=1) + done

    def next_tokens(self, phrases: Tensor, lengths: Tensor) -> Tensor:
        """(N, C) the tokens that advance a row: the next token of its phrase in progress (column
        of that phrase), else the first token of each unmet phrase; -1 elsewhere."""
        n, c, length = phrases.shape
        rows = torch.arange(n, device=phrases.device)
        going = self.cur >= 0
        nxt = phrases[rows, self.cur.clamp(min=0), self.done.clamp(max=length - 1)]  # (N,)
        first = phrases[:, :, 0].masked_fill(self.met | (lengths == 0), -1)        # (N, C)
        in_progress = torch.full_like(first, -1).scatter_(1, self.cur.clamp(min=0).unsqueeze(1), nxt.unsqueeze(1))
        return torch.where(going.unsqueeze(1), in_progress, first)

    def step(self, phrases: Tensor, lengths: Tensor, token: Tensor,
             ready: Tensor | None = None, copies: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Each row's (met, cur, done) after it outputs ``token`` (N,). With ``ready`` (N, C)
        (:func:`ready_to_complete` of the output before ``token``) and the rows' ``copies``
        (N, C, C), a phrase is met wherever the output comes to end with it (one unmet copy per
        occurrence), tracked or not: inside another phrase, or begun while another was in
        progress; without them, only the tracked phrase."""
        n, c, length = phrases.shape
        rows = torch.arange(n, device=token.device)
        expected = phrases[rows, self.cur.clamp(min=0), self.done.clamp(max=length - 1)]
        goes_on = (self.cur >= 0) & (token == expected)
        cur = torch.where(goes_on, self.cur, -1)
        done = torch.where(goes_on, self.done + 1, 0)
        starts = (phrases[:, :, 0] == token.unsqueeze(1)) & ~self.met & (lengths > 0)  # (N, C)
        restart = starts.any(dim=1) & ~goes_on
        cur = torch.where(restart, starts.long().argmax(dim=1), cur)
        done = torch.where(restart, 1, done)
        complete = (cur >= 0) & (done == lengths.gather(1, cur.clamp(min=0).unsqueeze(1)).squeeze(1))
        if ready is None or copies is None:
            met = self.met | (F.one_hot(cur.clamp(min=0), c).bool() & complete.unsqueeze(1))
        else:
            occurs = ready & (last_tokens(phrases, lengths) == token.unsqueeze(1)) & ~self.met  # (N, C)
            earlier = torch.ones(c, c, dtype=torch.bool, device=token.device).tril(-1)         # (C, C): j' < j
            copy_before = (copies & earlier & occurs.unsqueeze(1)).any(dim=2)
            met = self.met | (occurs & ~copy_before)                      # the first unmet copy of each
        return met, torch.where(complete, -1, cur), torch.where(complete, 0, done)

    def advanced(self, beams: Beams, rows: Tensor) -> "ConstraintBeams":
        """The progress of the new ``beams`` (after their last token), which continue ``rows``
        (B*K,) of the old ones (beam search's reorder): each new beam's is that of the candidate
        of its parent row with its last token, which :meth:`candidates` computed (a row's
        candidates with the same token, if any, have the same progress)."""
        token, met, cur, done = self.grown
        m = token.shape[1]
        last = beams.tokens[:, :, -1].reshape(-1, 1)                           # (N', 1)
        pick = rows * m + (token[rows] == last).int().argmax(dim=1)          # (N',) into the N*m candidates
        met = met[pick]
        closed = None if self.inside is None else (met & ~self.met[rows]).any(dim=1)
        return ConstraintBeams(self.phrases, self.copies, met, cur[pick], done[pick], self.inside, closed)

    def repeats(self, phrases: Tensor, lengths: Tensor, copies: Tensor, ready: Tensor, extra: Tensor) -> Tensor:
        """(N, C) the token that would complete each phrase again, where every one of its
        ``copies`` (N, C, C) is met and the output is ``ready`` (N, C) for it
        (:func:`ready_to_complete`); -1 elsewhere and where the token is one of ``extra`` (N, C),
        those that advance an unmet phrase (:meth:`next_tokens`)."""
        spent = (~copies | self.met.unsqueeze(1)).all(dim=2)               # (N, C) every copy met
        last = last_tokens(phrases, lengths)
        allowed = (last.unsqueeze(2) == extra.unsqueeze(1)).any(dim=2)
        return last.masked_fill(~(ready & spent) | allowed, -1)

    def candidates(self, best: Callable[[BlockHook], tuple[Tensor, Tensor]], beams: Beams, beam: int, step: int,
                   eos_id: int, forced: Tensor | None = None) -> Candidates:
        """The step's candidates in bank order (see the module doc): each row's best w tokens
        and the tokens that advance its constraints, scored, the top 2K kept; only the first K
        may end, and only with every constraint met; no met phrase is completed again
        (:meth:`repeats`), except by a ``forced`` (N,) prefix token (-1: free). Each candidate's
        progress is kept for :meth:`advanced`.

        ``best(hook)`` is each row's 2K best (log-probs, tokens) of the step, ``hook`` shown each
        block of log-probs before the top-k: :func:`~transduce.inference.search.common.best_tokens`,
        whose hook here writes the refusals in and reads the ``extra`` tokens' log-probs.

        Shape: -> Candidates of width min(2K, M).
        """
        phrases, lengths, copies = self.sentence_rows(beams.ids)
        b, k = beams.scores.shape
        extra = self.next_tokens(phrases, lengths)                        # (N, C)
        ready = ready_to_complete(phrases, lengths, beams.tokens.view(b * k, -1)[:, 1:])
        again = self.repeats(phrases, lengths, copies, ready, extra)
        if forced is not None:
            again = again.masked_fill(forced.unsqueeze(1) >= 0, -1)
        glued = None
        if self.inside is not None:
            glued = self.closed if forced is None else self.closed & (forced < 0)
            glued = glued if bool(glued.any()) else None
        refusals = _Refusals(eos_id, ~self.all_met(lengths, self.met), again, extra, glued, self.inside)
        top_logp, top_token = best(refusals.apply)                       # (N, w) each
        extra_logp = torch.cat(refusals.extra_logp) if len(refusals.extra_logp) > 1 else refusals.extra_logp[0]
        c = extra.shape[1]
        earlier = torch.ones(c, c, dtype=torch.bool, device=extra.device).tril(-1)  # (C, C): j < i
        repeated = ((extra.unsqueeze(2) == extra.unsqueeze(1)) & earlier).any(dim=2)
        in_top = (extra.unsqueeze(2) == top_token.unsqueeze(1)).any(dim=2)
        extra_logp = extra_logp.masked_fill((extra < 0) | repeated | in_top, -math.inf)
        token = torch.cat([top_token, extra.clamp(min=0)], dim=1)        # (N, m), m = w + C
        m = token.shape[1]
        total = (beams.scores.view(-1, 1) + torch.cat([top_logp, extra_logp], dim=1)).view(b, k * m)
        grown = ConstraintBeams(self.phrases, self.copies, self.met.repeat_interleave(m, 0),
                                self.cur.repeat_interleave(m, 0), self.done.repeat_interleave(m, 0))
        rows_l = lengths.repeat_interleave(m, 0)
        met, cur, done = grown.step(phrases.repeat_interleave(m, 0), rows_l, token.view(-1),
                                    ready.repeat_interleave(m, 0), copies.repeat_interleave(m, 0))
        self.grown = token, met, cur, done
        bank = grown.progress(rows_l, met, done).view(b, k * m)
        ends = (token.view(b, k * m) == eos_id) | (beams.limit.unsqueeze(1) <= step + 1)
        total = total.masked_fill(ends & ~grown.all_met(rows_l, met).view(b, k * m), -math.inf)
        order = bank_order(total, bank, min(2 * beam, k * m), beam > 1)  # (B, 2K)
        scores = total.gather(1, order)
        parent = order // m
        ends = ends.gather(1, order) & (scores > -math.inf)
        ends[:, beam:] = False  # as beam search: only the first K may finish
        return Candidates(scores, parent, token.view(b, k * m).gather(1, order), ends)


@dataclass
class _Refusals:
    """What a step of :meth:`ConstraintBeams.candidates` refuses each of its N rows, written
    into the log-probs block by block (no (N, V) mask, no copy)."""

    eos_id: int
    unmet: Tensor           # (N,) bool: not every phrase met yet, so no EOS
    again: Tensor           # (N, C) tokens that would complete a spent phrase again (-1: none)
    extra: Tensor           # (N, C) the tokens that advance a phrase (:meth:`ConstraintBeams.next_tokens`)
    glued: Tensor | None    # (N,) bool: rows that have just completed a phrase (None: no row)
    inside: Tensor | None   # (V,) bool: the pieces that continue a word
    extra_logp: list[Tensor] = field(default_factory=list)  # (R, C) per block: the ``extra`` tokens' log-probs

    def apply(self, logp: Tensor, start: int) -> None:
        """Refuse (-inf, in place) in ``logp``, the log-probs of rows start:start + R: EOS where
        a phrase is unmet, the ``again`` tokens, and where a row ``glued``, the pieces that
        would continue the word of the phrase it has just completed (but the ``extra`` ones);
        then keep the ``extra`` tokens' log-probs (blocks come in row order)."""
        stop = start + logp.shape[0]
        self._refuse(logp, start, stop)
        self.extra_logp.append(logp.gather(1, self.extra[start:stop].clamp(min=0)))

    def _refuse(self, logp: Tensor, start: int, stop: int) -> None:
        logp[:, self.eos_id] = logp[:, self.eos_id].masked_fill(self.unmet[start:stop], -math.inf)
        again = self.again[start:stop]
        never = torch.full(again.shape, math.inf, device=logp.device).masked_fill(again >= 0, -math.inf)
        logp.scatter_reduce_(1, again.clamp(min=0), never, "amin")        # -inf where ``again`` names it
        if self.glued is None:
            return
        rows = self.glued[start:stop].nonzero().squeeze(1)                # (R',)
        if not rows.numel():
            return
        extra = self.extra[start:stop][rows]
        refused = self.inside.expand(rows.shape[0], -1).clone()            # (R', V)
        keep = refused.gather(1, extra.clamp(min=0)) & (extra < 0)          # (R', C) False: an advancing token
        refused.scatter_(1, extra.clamp(min=0), keep)
        logp[rows] = logp[rows].masked_fill(refused, -math.inf)


def last_tokens(phrases: Tensor, lengths: Tensor) -> Tensor:
    """(N, C) each phrase's last token (PAD columns: their -1)."""
    return phrases.gather(2, (lengths - 1).clamp(min=0).unsqueeze(2)).squeeze(2)


def ready_to_complete(phrases: Tensor, lengths: Tensor, output: Tensor) -> Tensor:
    """(N, C) bool: the ``output`` (N, t) ends with all of the phrase but its last token (so
    that token would complete it); False for PAD columns."""
    length = phrases.shape[2]
    pos = torch.arange(length - 1, device=phrases.device) - length + lengths.unsqueeze(2)  # (N, C, L-1)
    head = phrases.gather(2, pos.clamp(min=0))                            # the phrase but its last token,
    tail = F.pad(output, (max(length - 1 - output.shape[1], 0), 0), value=-2)  # never matches a token
    tail = tail[:, tail.shape[1] - (length - 1):]                         # (N, L-1) the output's last tokens
    return ((head == tail.unsqueeze(1)) | (pos < 0)).all(dim=2) & (lengths > 0)  # right-aligned


def bank_order(scores: Tensor, bank: Tensor, width: int, best_first: bool = True) -> Tensor:
    """The first ``width`` candidates of each sentence in dynamic beam allocation's order: the
    best candidate of all (if ``best_first``), then the best of each bank (fullest bank first),
    then the second best of each, and so on; -inf scores last. (B, M) scores and banks ->
    (B, width) indices.

    The best of all goes first (with a beam of 2 or more, so that the fullest bank keeps a beam)
    because with more banks than beams (a constraint of several
    tokens) the round-robin alone would drop the emptiest bank, and with it the hypothesis the
    model prefers, which often produces the constraint itself a few words later."""
    n_banks = int(bank.max()) + 1
    by_score = scores.argsort(dim=1, descending=True, stable=True)        # (B, M)
    sorted_bank = bank.gather(1, by_score)
    rank = F.one_hot(sorted_bank, n_banks).cumsum(dim=1).gather(2, sorted_bank.unsqueeze(2)).squeeze(2) - 1
    key = rank * n_banks + (n_banks - 1 - sorted_bank)                   # (B, M) round-robin, fullest first
    if best_first:
        key[:, 0] = -1                                                    # the best of all
    key = key.masked_fill(scores.gather(1, by_score) == -math.inf, torch.iinfo(torch.long).max)
    return by_score.gather(1, key.topk(width, dim=1, largest=False).indices)
