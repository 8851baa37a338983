"""Speculative decoding: a small draft model proposes tokens, the model checks them in one pass.

Per round the draft, with its own KV cache, proposes K tokens one at a time; the target model
scores its pending token and the K proposals as one cached (K+1)-position decoder step, the
longest prefix it agrees with is kept plus the target's own next token, and both caches are cut
back past the first rejection. Greedy search keeps a proposal when it equals the target's most
probable token (the blockwise parallel decoding of Stern et al., 2018,
https://arxiv.org/abs/1811.03115), so the output is the target's own greedy search; sampling
keeps it with probability min(1, p/q) and resamples a rejection from norm(max(0, p - q))
(Leviathan et al., 2023, https://arxiv.org/abs/2211.17192), so the output is distributed as the
target's own samples.

Batches: all rows of a batch share one cache length (the decoder takes one start position), so a
round advances every unfinished row by the smallest number of tokens any of them accepted (rows
that accepted more keep only that many and propose again). In greedy search a row that ends (EOS
or its length limit) within its own accepted tokens leaves the batch with all of them; in
sampling it does not (whether a row stops early must not depend on its own later draws, or the
tokens it keeps would be biased towards those the draft proposes).

Legend: N active rows, K proposals per round, D d_model, V target vocabulary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import Tensor

from ...config import DecodeConfig
from ...errors import ConfigError
from ..speed import new_cache, prepared
from .common import SearchOutput, Seq2Seq, StepHook, max_lengths, step_log_probs


@dataclass
class DraftStats:
    """Counts over the searches of a :class:`Speculation`: model passes per row (``rounds``),
    draft tokens proposed and accepted (the model agreed; a batch may keep fewer, as its rows
    advance together), and output tokens."""

    rounds: int = 0
    proposed: int = 0
    accepted: int = 0
    tokens: int = 0

    @property
    def acceptance(self) -> float:
        """Fraction of the proposed draft tokens that were kept."""
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def tokens_per_round(self) -> float:
        """Output tokens per target decoder pass (1.0 for plain greedy search)."""
        return self.tokens / self.rounds if self.rounds else 0.0


@dataclass
class Speculation:
    """A draft model with the target's vocabulary and special ids (see :func:`check_draft`), and
    the statistics of the searches run with it.

    How many tokens it proposes per round, at most K, is ``decode.draft_tokens``. With
    ``decode.draft_threshold`` a row stops offering proposals in a round after one whose
    probability (the draft's own, after filtering when sampling) is below it, and the draft stops
    when every row has; 0 always offers K. A draft unsure of its token is likely to be rejected,
    and a rejected proposal costs a draft step for nothing. The output does not depend on it: each
    position after the last offer is the model's own choice (greedy) or draw (sampling), and
    whether a position is offered depends only on the tokens before it."""

    draft: Seq2Seq
    stats: DraftStats = field(default_factory=DraftStats)


def check_draft(target_config, draft_config) -> None:
    """A one-line ConfigError unless the draft reads and writes the target's token ids."""
    if getattr(draft_config, "arch", "encoder_decoder") != "encoder_decoder":
        raise ConfigError(f"draft: needs an encoder_decoder model; the draft is {draft_config.arch}")
    for key in ("src_vocab_size", "tgt_vocab_size", "pad_id", "bos_id", "eos_id"):
        if getattr(target_config, key) != getattr(draft_config, key):
            raise ConfigError(f"draft: the draft's model.{key} is {getattr(draft_config, key)}, the model's "
                              f"{getattr(target_config, key)}: a draft must share the model's tokenizer")


# Filtered log-probabilities to sample from: (N, V) -> (N, V) (e.g. sampling.filter_logits).
Filter = Callable[[Tensor], Tensor]


@dataclass
class _Rows:
    """The active rows: which sentence each is, its tokens so far and its length limit."""

    ids: Tensor        # (N,) sentence index in the batch
    seq: Tensor        # (N, T_cap + 1) BOS then the committed tokens (later columns unused)
    limit: Tensor      # (N,) max_len

    def select(self, keep: Tensor) -> "_Rows":
        return _Rows(self.ids[keep], self.seq[keep], self.limit[keep])


def truncate(cache, length: int) -> None:
    """Cut a decoder cache back to its first ``length`` positions, in place (a rejection)."""
    for layer in cache.layers:
        if layer.self_k is None:  # nothing decoded yet
            continue
        layer.self_k, layer.self_v = layer.self_k[:, :, :length], layer.self_v[:, :, :length]
    cache.length = length


@torch.no_grad()
def speculative_search(model: Seq2Seq, src: Tensor, speculation: Speculation,
                       decode: DecodeConfig = DecodeConfig(), sample: Filter | None = None,
                       generator: torch.Generator | None = None, on_step: StepHook | None = None) -> SearchOutput:
    """Greedy search (``sample`` None) or sampling from ``sample``'s filtered distribution, with
    ``speculation``'s draft proposing ``decode.draft_tokens`` tokens per target pass.

    Same conventions, length limits and output as
    :func:`~transduce.inference.search.greedy.greedy_search` / :func:`~transduce.inference.search.sampling.sample`
    (scores are the target's log-probabilities); ``generator`` drives the sampling; ``on_step``
    is told after each round the tokens committed so far, all settled.

    Shape: src (B, S) -> SearchOutput with K = 1.
    """
    check_draft(model.config, speculation.draft.config)
    with prepared(model), prepared(speculation.draft):
        return _Search(model, src, speculation, decode, sample, generator).run(on_step)


class _Search:
    """The state of one speculative search (see :func:`speculative_search`)."""

    def __init__(self, model: Seq2Seq, src: Tensor, speculation: Speculation, decode: DecodeConfig,
                 sample: Filter | None, generator: torch.Generator | None):
        self.model, self.draft, self.k = model, speculation.draft, decode.draft_tokens
        self.log_threshold = math.log(decode.draft_threshold) if decode.draft_threshold > 0 else None
        self.stats, self.decode, self.sample, self.generator = speculation.stats, decode, sample, generator
        cfg = self.cfg = model.config
        b, device = src.shape[0], src.device
        limit = max_lengths(src, cfg, decode.max_len_a, decode.max_len_b)          # (B,)
        seq = torch.full((b, int(limit.max()) + 1), cfg.pad_id, dtype=torch.long, device=device)
        seq[:, 0] = cfg.bos_id
        self.rows = _Rows(torch.arange(b, device=device), seq, limit)
        self.out_tokens = torch.full((b, seq.shape[1] - 1), cfg.pad_id, dtype=torch.long, device=device)
        self.out_lengths = torch.zeros(b, dtype=torch.long, device=device)
        self.out_logp = torch.zeros(b, dtype=torch.float32, device=device)
        self.enc, self.draft_enc = model.encode(src), self.draft.encode(src)
        self.cache, self.draft_cache = new_cache(model), new_cache(self.draft)
        # the target cache holds positions 0..m-1, the draft's 0..draft_len-1 (<= m); position
        # m's token (seq[:, m]) is the next input of both
        self.m, self.draft_len = 0, 0
        draft_cfg = self.draft.config  # learned positions: the draft never decodes past its last
        self.draft_cap = draft_cfg.max_positions if draft_cfg.positions == "learned" else None

    def run(self, on_step: StepHook | None = None) -> SearchOutput:
        while self.rows.ids.numel():
            self.round()
            if on_step is not None:
                committed = self.out_lengths.clone()                   # the rows that ended: all theirs
                committed[self.rows.ids] = self.m                       # the others: the common advance
                on_step(torch.arange(len(committed), device=committed.device), self.out_tokens, committed)
        return SearchOutput(self.out_tokens[:, None], self.out_lengths[:, None], self.out_logp[:, None].clone(),
                            self.out_logp[:, None])

    def round(self) -> None:
        """Propose, verify, commit and cut back once."""
        m = self.m
        k = min(self.k, int(self.rows.limit.max()) - 1 - m)   # no proposals past the longest limit
        if self.draft_cap is not None:
            k = min(k, self.draft_cap - m)
        proposals, draft_logp, offered = self.propose(k)                           # (N, k'), (N, k', V), (N,)
        k = proposals.shape[1]                                                     # k' <= k: the draft may stop early
        fed = torch.cat([self.rows.seq[:, m:m + 1], proposals], dim=1)             # (N, k+1)
        states = self.model.decode(fed, self.enc, self.cache, project=False).states  # (N, k+1, D)
        logp = self.scores(self.model, states, m)                                  # (N, k+1, V)
        tokens, agreed = self.verify(proposals, draft_logp, offered, logp)         # (N, k+1), (N,)
        self.commit(tokens, logp.gather(2, tokens[:, :, None]).squeeze(2), agreed, offered, k)

    def propose(self, k: int) -> tuple[Tensor, Tensor | None, Tensor]:
        """Up to k draft tokens per row, (when sampling) the draft's filtered log-probs of each
        step, and how many of them each row offers: a row stops offering after a token less
        probable than the threshold, the batch's draft stops when every row has."""
        seq, m = self.rows.seq, self.m
        fed = seq[:, self.draft_len:m + 1]                                         # (N, m+1-draft_len)
        tokens, logps = [], []
        offered = torch.zeros(seq.shape[0], dtype=torch.long, device=seq.device)   # (N,)
        sure = torch.ones(seq.shape[0], dtype=torch.bool, device=seq.device)       # (N,) still offering
        for j in range(k):
            states = self.draft.decode(fed, self.draft_enc, self.draft_cache, project=False).states[:, -1:]
            logp = self.scores(self.draft, states, m + j)[:, 0]                    # (N, V)
            if self.sample is None:
                token_logp, token = logp.max(dim=-1)
            else:
                logp = self.sample(logp)
                token = torch.multinomial(logp.exp(), 1, generator=self.generator).squeeze(1)
                token_logp = logp.gather(1, token[:, None]).squeeze(1)
                logps.append(logp)
            tokens.append(token)
            fed = token[:, None]
            offered += sure
            if self.log_threshold is not None:
                sure &= token_logp >= self.log_threshold
                if not bool(sure.any()):
                    break
        if tokens:
            self.draft_len = m + len(tokens)
        empty = seq.new_empty(seq.shape[0], 0)
        return ((torch.stack(tokens, dim=1) if tokens else empty), (torch.stack(logps, dim=1) if logps else None),
                offered)

    def scores(self, model: Seq2Seq, states: Tensor, step: int) -> Tensor:
        """The model's step log-probabilities (:func:`step_log_probs`) of consecutive positions
        starting at output index ``step``. (N, t, D) -> (N, t, V) float32."""
        n, t, _ = states.shape
        if step >= self.decode.min_len:  # every position is past min_len: one call for all
            logp = step_log_probs(model.output_proj(states.reshape(n * t, -1)), self.cfg, step, 0)
            return logp.view(n, t, -1)
        return torch.stack([step_log_probs(model.output_proj(states[:, j]), self.cfg, step + j, self.decode.min_len)
                            for j in range(t)], dim=1)

    def verify(self, proposals: Tensor, draft_logp: Tensor | None, offered: Tensor, logp: Tensor
               ) -> tuple[Tensor, Tensor]:
        """Each row's output tokens for the positions of this round and how many of the proposals
        it offered it accepted; the tokens after the first rejection (or the last offer) are the
        target's choice there, then unused.

        Shape: proposals (N, k), draft_logp (N, k, V) or None, offered (N,), logp (N, k+1, V)
        -> tokens (N, k+1), accepted (N,).
        """
        n, k = proposals.shape
        if self.sample is None:
            best = logp.argmax(dim=-1)                                             # (N, k+1)
            agreed = (proposals == best[:, :k]).long().cumprod(dim=1).sum(dim=1)
            return best, torch.minimum(agreed, offered)
        p = self.sample(logp.reshape(n * (k + 1), -1)).view(n, k + 1, -1).exp()   # (N, k+1, V)
        q = draft_logp.exp() if k else p[:, :0]                                    # (N, k, V)
        p_d = p[:, :k].gather(2, proposals[:, :, None]).squeeze(2)                 # (N, k)
        q_d = q.gather(2, proposals[:, :, None]).squeeze(2)
        u = torch.rand(n, k, generator=self.generator, device=p.device)
        agreed = torch.minimum((u * q_d < p_d).long().cumprod(dim=1).sum(dim=1), offered)  # u < p/q
        rows = torch.arange(n, device=p.device)
        # at the first rejection sample from norm(max(0, p - q)); after all offers accepted from p
        residual = p[rows, agreed].clone()                                          # (N, V)
        rejected = agreed < offered
        residual[rejected] = (residual[rejected] - q[rows[rejected], agreed[rejected]]).clamp(min=0)
        residual[residual.sum(dim=1) <= 0] = p[rows, agreed][residual.sum(dim=1) <= 0]  # p == q: rounding
        last = torch.multinomial(residual, 1, generator=self.generator).squeeze(1)  # (N,)
        tokens = torch.cat([proposals, last[:, None]], dim=1)
        tokens[rows, agreed] = last
        return tokens, agreed

    def commit(self, tokens: Tensor, token_logp: Tensor, agreed: Tensor, offered: Tensor, k: int) -> None:
        """Write the accepted tokens, drop the rows that ended, advance the rest together."""
        rows, m, eos = self.rows, self.m, self.cfg.eos_id
        n_rows = tokens.shape[0]
        positions = torch.arange(k + 1, device=tokens.device)                     # (k+1,)
        ends = (tokens == eos) | (m + positions + 1 >= rows.limit[:, None])        # (N, k+1)
        if self.sample is None:  # a row ending within its accepted tokens leaves with all of them
            ends &= positions <= agreed[:, None]
            done = ends.any(dim=1)                                                 # (N,)
            advance = int(agreed[~done].min()) + 1 if bool((~done).any()) else 0
        else:  # every row stops where any first rejects: a row's stop must not depend on its own later draws
            advance = int(agreed.min()) + 1
            ends &= positions < advance
            done = ends.any(dim=1)
        count = torch.where(done, ends.long().argmax(dim=1) + 1, advance)         # tokens each row keeps
        keep = positions < count[:, None]                                          # (N, k+1)
        out_rows = rows.ids[:, None].expand(-1, k + 1)[keep]
        out_cols = (m + positions).expand(n_rows, -1)[keep]
        self.out_tokens[out_rows, out_cols] = tokens[keep]
        self.out_logp.index_add_(0, rows.ids, (token_logp * keep).sum(dim=1))
        self.out_lengths[rows.ids[done]] = m + count[done]
        rows.seq[:, m + 1:m + k + 2] = tokens
        self.stats.rounds += n_rows
        self.stats.proposed += int(offered.sum())
        self.stats.accepted += int(torch.where(done, torch.minimum(agreed, count), agreed).sum())
        self.stats.tokens += int(count.sum())
        if bool(done.all()):
            self.rows = rows.select(rows.ids[:0])
            return
        self.m = m + advance
        truncate(self.cache, self.m)
        self.draft_len = min(self.draft_len, self.m)
        truncate(self.draft_cache, self.draft_len)
        if bool(done.any()):
            keep_rows = (~done).nonzero().squeeze(1)
            self.rows = rows.select(keep_rows)
            self.enc, self.draft_enc = self.enc.index_select(keep_rows), self.draft_enc.index_select(keep_rows)
            self.cache, self.draft_cache = self.cache.reorder(keep_rows), self.draft_cache.reorder(keep_rows)
