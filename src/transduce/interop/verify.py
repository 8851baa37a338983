"""Check an exported model against the eager one on a fixed probe set.

The probe set is a few seeded random source/target id sequences of different lengths
(padding included), so it exists for any model, trained or not. Logits are compared with an
absolute tolerance (``LOGIT_TOL``); searched outputs must be identical, except for a difference
that a runtime within that tolerance may make: a tie the eager model shows (see
:func:`check_same_outputs` and ``TOKEN_TOL``).

Legend: B probe sentences, S source length, T target length, V target vocabulary.
"""

from __future__ import annotations

import logging

import torch
from torch import Tensor

from ..inference.search.common import Seq2Seq, step_log_probs
from ..model import Transformer
from .base import ExportError

logger = logging.getLogger(__name__)

# An exported model's logits may differ from the eager model's by LOGIT_TOL (every logit check
# here): float32 sums over d_model products through a few layers round far below it. A
# log-softmax z_i - logsumexp(z) then moves by at most twice that (logsumexp moves by no more
# than the largest change of a logit), so a runtime within LOGIT_TOL picks another greedy token
# than eager's only where eager's two log-probs are within TOKEN_TOL, and ranks two hypotheses
# w, g otherwise only where eager's scores are within TOKEN_TOL * (|w| + |g|). A wrong weight
# moves them by tenths, not ten-thousandths.
LOGIT_TOL = 1e-4
TOKEN_TOL = 2 * LOGIT_TOL
N_SPECIAL = 4  # pad, bos, eos, unk: probes use ordinary tokens only


def probe_batch(vocab_size: int, pad_id: int, end_id: int, lengths: tuple[int, ...], seed: int,
                start_id: int | None = None) -> Tensor:
    """Random ordinary tokens, ``end_id`` appended (or ``start_id`` prepended), right-padded.

    Shape: -> (B, max(lengths) + 1) long, B = len(lengths).
    """
    g = torch.Generator().manual_seed(seed)
    width = max(lengths) + 1
    out = torch.full((len(lengths), width), pad_id, dtype=torch.long)
    for i, n in enumerate(lengths):
        body = torch.randint(N_SPECIAL, vocab_size, (n,), generator=g)
        row = torch.cat([torch.tensor([start_id]), body]) if start_id is not None else \
            torch.cat([body, torch.tensor([end_id])])
        out[i, : n + 1] = row
    return out


def probe_sources(model: Transformer, seed: int = 0) -> Tensor:
    """Source ids for the checks: tokens + EOS, right-padded. (B, S)."""
    cfg = model.config
    return probe_batch(cfg.src_vocab_size, cfg.pad_id, cfg.eos_id, (7, 3, 11, 1, 5, 9), seed)


def probe_targets(model: Transformer, batch: int, seed: int = 1) -> Tensor:
    """Teacher-forced decoder inputs: BOS + random tokens, all the same length. (B, T)."""
    cfg = model.config
    return probe_batch(cfg.tgt_vocab_size, cfg.pad_id, cfg.eos_id, (6,) * batch, seed, start_id=cfg.bos_id)


@torch.no_grad()
def eager_logits(model: Transformer, src: Tensor, tgt: Tensor) -> Tensor:
    """Teacher-forced logits of the eager model. (B, S), (B, T) -> (B, T, V)."""
    return model(src, tgt).float()


def check_close(name: str, got: Tensor, want: Tensor, atol: float) -> float:
    """Max |got - want|; raises ExportError naming ``name`` if it exceeds ``atol``."""
    got, want = torch.as_tensor(got).float(), torch.as_tensor(want).float()
    if got.shape != want.shape:
        raise ExportError(f"verification failed: {name} has shape {tuple(got.shape)}, expected {tuple(want.shape)}")
    diff = float((got - want).abs().max()) if got.numel() else 0.0
    if not diff <= atol:  # also catches NaN
        raise ExportError(f"verification failed: {name} differs from the eager model by {diff:.3g} (> {atol})")
    return diff


@torch.no_grad()
def token_log_probs(model: Transformer, src_row: Tensor, tokens: list[int]) -> Tensor:
    """The eager model's log-probs at each step of ``tokens`` (BOS excluded) as search sees them:
    the tokens search never emits at -inf (:func:`step_log_probs`). src_row: (S,) -> (T, V)."""
    cfg = model.config
    if not tokens:
        return torch.zeros(0, cfg.tgt_vocab_size)
    src = src_row[src_row != cfg.pad_id][None]                           # (1, S')
    tgt = torch.tensor([[cfg.bos_id] + tokens[:-1]])                      # (1, T)
    return step_log_probs(model(src, tgt)[0].float(), cfg, 0, 0)          # (T, V)


def sequence_log_prob(model: Transformer, src_row: Tensor, tokens: list[int]) -> float:
    """log P(tokens | src) under the eager model (tokens exclude BOS). src_row: (S,)."""
    return _score(token_log_probs(model, src_row, tokens), tokens)


def strip_specials(tokens: list[int], eos_id: int, pad_id: int) -> list[int]:
    """Ids up to the first EOS (kept) with padding dropped: the common form for comparing."""
    out = []
    for t in tokens:
        if t == pad_id:
            continue
        out.append(int(t))
        if t == eos_id:
            break
    return out


def check_same_outputs(name: str, model: Transformer, src: Tensor, want: list[list[int]],
                       got: list[list[int]], beam: bool = False, renormalized: bool = False) -> int:
    """Compare searched outputs sentence by sentence; returns the number of accepted differences.

    A difference is accepted only where the eager model shows a tie that a runtime within
    ``LOGIT_TOL`` may break the other way (see ``TOKEN_TOL``): it scores the two outputs w, g
    within ``TOKEN_TOL * (|w| + |g|)``; or, for greedy outputs, the exported one is a greedy path
    of the eager model up to such ties (each token within ``TOKEN_TOL`` of eager's best after the
    same prefix: one tie broken otherwise sends the rest of the sentence elsewhere). Not
    accepted: a beam output of any other score, better or worse. Two beam searches parted by a
    near tie at a pruning step may end far apart, but so may a wrong conversion's, whose output
    the eager model sometimes likes better than its own beam's (tests/interop/test_verify_outputs.py).

    Args:
        beam: beam outputs (no greedy path rule).
        renormalized: the runtime leaves the tokens search never emits (PAD, BOS) out of its
            softmax, as CTranslate2's ``suppress_sequences`` does, where ours forbids them after
            it: its beam ranks each hypothesis higher by the log of the mass those tokens had at
            each step, and the two searches can part by that much. The tie is widened by both
            hypotheses' such mass under the eager model (next to nothing for a trained model).

    Raises:
        ExportError naming the probe, both outputs and their log-prob difference.
    """
    cfg = model.config
    accepted = 0
    for i, (w, g) in enumerate(zip(want, got, strict=True)):
        w, g = strip_specials(w, cfg.eos_id, cfg.pad_id), strip_specials(g, cfg.eos_id, cfg.pad_id)
        if w == g:
            continue
        w_logp, g_logp = token_log_probs(model, src[i], w), token_log_probs(model, src[i], g)  # (T, V) each
        gain = _score(g_logp, g) - _score(w_logp, w)
        tol = TOKEN_TOL * (len(w) + len(g))
        if beam and renormalized:
            tol += _suppressed(w_logp) + _suppressed(g_logp)
        if abs(gain) <= tol or (not beam and _near_greedy(g_logp, g)):
            accepted += 1
            continue
        raise ExportError(f"verification failed: {name} output for probe {i} is {g}, the eager "
                          f"model gives {w} (log-prob difference {gain:.3g}, a tie is within {tol:.2g})")
    if accepted:
        logger.info("%s: %d output(s) differ from eager only by near ties", name, accepted)
    return accepted


def _score(logp: Tensor, tokens: list[int]) -> float:
    """Sum of ``tokens``' log-probs. logp: (T, V)."""
    return float(logp.gather(1, torch.tensor(tokens, dtype=torch.long)[:, None]).sum()) if tokens else 0.0


def _near_greedy(logp: Tensor, tokens: list[int]) -> bool:
    """Whether each of ``tokens`` is within TOKEN_TOL of the best token at its step. logp: (T, V)."""
    chosen = logp.gather(1, torch.tensor(tokens, dtype=torch.long)[:, None])[:, 0]  # (T,)
    return bool((logp.max(dim=1).values - chosen <= TOKEN_TOL).all())


def _suppressed(logp: Tensor) -> float:
    """-sum over steps of log(mass of the tokens search may emit): what a softmax over those
    tokens alone adds to a hypothesis' score. logp: (T, V) with the others at -inf."""
    return float(-logp.logsumexp(dim=1).sum().clamp(max=0.0)) if logp.numel() else 0.0


def search_ids(model: Seq2Seq, src: Tensor, beam: int, max_len: int, lenpen: float = 0.0,
               stop: str = "k_finished") -> list[list[int]]:
    """Our greedy (beam=1) or beam search outputs for the probe set, best hypothesis each: of the
    eager model, or of anything the searches run over (the exported graphs' GraphModel)."""
    from ..config import DecodeConfig
    from ..inference.search import beam_search
    from ..inference.search import greedy_search

    decode = DecodeConfig(beam=beam, lenpen=lenpen, max_len_a=0.0, max_len_b=max_len, stop=stop)
    with torch.no_grad():
        out = greedy_search(model, src, decode) if beam == 1 else beam_search(model, src, decode)
    return [out.hypothesis(i) for i in range(src.shape[0])]
