"""Check an exported model against the eager one on a fixed probe set.

The probe set is a few seeded random source/target id sequences of different lengths
(padding included), so it exists for any model, trained or not. Logits are compared with an
absolute tolerance; searched outputs must be identical, except that a difference is accepted
when the two hypotheses' log-probabilities under the eager model differ by less than
``TIE_TOL`` (a near tie that float rounding may break either way), or, for a runtime whose
beam search stops by another rule, when its output scores better (see
:func:`check_same_outputs`).

Legend: B probe sentences, S source length, T target length, V target vocabulary.
"""

from __future__ import annotations

import logging

import torch
from torch import Tensor

from ..inference.search.common import Seq2Seq, output_log_softmax
from ..model import Transformer
from .base import ExportError

logger = logging.getLogger(__name__)

TIE_TOL = 1e-3
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
def sequence_log_prob(model: Transformer, src_row: Tensor, tokens: list[int]) -> float:
    """log P(tokens | src) under the eager model (tokens exclude BOS). src_row: (S,)."""
    cfg = model.config
    src = src_row[src_row != cfg.pad_id][None]                           # (1, S')
    tgt = torch.tensor([[cfg.bos_id] + tokens[:-1]]) if tokens else torch.tensor([[cfg.bos_id]])
    logp = output_log_softmax(model(src, tgt).float(), cfg)[0]            # (T, V)
    return float(logp.gather(1, torch.tensor(tokens)[:, None]).sum()) if tokens else 0.0


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
                       got: list[list[int]], beam: bool = False) -> int:
    """Compare searched outputs sentence by sentence; returns the number of accepted differences.

    Always accepted: near ties. For ``beam`` outputs also two hypotheses that both stopped at
    the length limit without EOS (beam searches rank unfinished hypotheses at the limit in
    different ways), and an exported output the eager model itself scores higher than its own
    (a beam search is approximate: float rounding in a near tie at an earlier step sends the two
    searches down different paths, and the other one found the likelier sentence; a wrong
    conversion does not make the eager model prefer its outputs). Raises ExportError for any
    other difference.
    """
    cfg = model.config
    accepted = 0
    for i, (w, g) in enumerate(zip(want, got, strict=True)):
        w, g = strip_specials(w, cfg.eos_id, cfg.pad_id), strip_specials(g, cfg.eos_id, cfg.pad_id)
        if w == g:
            continue
        if beam and cfg.eos_id not in w and cfg.eos_id not in g and len(w) == len(g):
            accepted += 1
            continue
        gain = sequence_log_prob(model, src[i], g) - sequence_log_prob(model, src[i], w)
        if abs(gain) <= TIE_TOL or (beam and gain > 0):
            accepted += 1
            continue
        raise ExportError(f"verification failed: {name} output for probe {i} is {g}, the eager "
                          f"model gives {w} (log-prob difference {gain:.3g})")
    if accepted:
        logger.info("%s: %d output(s) differ from eager only by near ties",
                    name, accepted)
    return accepted


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
