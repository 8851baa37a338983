"""Check our model against a reference (an export in its runtime, or the transformers model an
import came from) on fixed probes: :func:`check_against`, the one check every export and import runs.

The probes are a few seeded random id sequences of different lengths (padding included), so they
exist for any model, trained or not, one kind per model kind (:func:`default_probe`): sources and
teacher-forced targets for a translation model, BOS-first prompts for a language model, padded
ids with some [MASK] and token types for an encoder. A :class:`Reference` runs them behind the
same calls in our ids. Outputs are compared with an absolute tolerance (``LOGIT_TOL``); a
translation model's searched outputs must be identical, except for a difference that a runtime
within that tolerance may make: a tie the eager model shows (see :func:`check_same_outputs` and
``TOKEN_TOL``); a language model's greedy continuations must be identical.

Legend: B probe sentences, S source length, T target length, V target vocabulary.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import Tensor

from ..config import GenerationConfig, ModelConfig
from ..inference.search.common import Seq2Seq, step_log_probs
from ..inference.search.lm import generate_ids
from ..model import Transformer
from ..progress import progress_bar
from .base import ExportError
from ..config import DecodeConfig
from ..inference.search import beam_search
from ..inference.search import greedy_search

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


def probe_prompts(cfg: ModelConfig, batch: int = 6, length: int = 7, seed: int = 0) -> Tensor:
    """A language model's prompts: BOS + random ordinary tokens, all of one length. (B, length)."""
    g = torch.Generator().manual_seed(seed)
    body = torch.randint(N_SPECIAL, cfg.tgt_vocab_size, (batch, length - 1), generator=g)
    return torch.cat([torch.full((batch, 1), cfg.bos_id), body], dim=1)


def probe_inputs(cfg: ModelConfig, seed: int = 0, lengths: tuple[int, ...] = (7, 3, 11, 1, 5, 9)
                 ) -> tuple[Tensor, Tensor | None]:
    """An encoder's: BOS + random tokens + EOS of several ``lengths``, right-padded, some tokens
    [MASK] (the last id); random token types (None without them). -> (B, T) ids, (B, T) types."""
    lengths = tuple(min(n, cfg.max_positions - 2) for n in lengths)  # BOS and EOS fit too
    ids = probe_batch(cfg.src_vocab_size - 1, cfg.pad_id, cfg.eos_id, lengths, seed)
    ids = torch.cat([torch.full((ids.shape[0], 1), cfg.bos_id), ids], dim=1)  # (B, T)
    g = torch.Generator().manual_seed(seed + 1)
    masked = (torch.rand(ids.shape, generator=g) < 0.2) & (ids > cfg.eos_id)
    ids = ids.masked_fill(masked, cfg.src_vocab_size - 1)
    if not cfg.type_vocab_size:
        return ids, None
    return ids, torch.randint(cfg.type_vocab_size, ids.shape, generator=g)


@dataclass(frozen=True)
class Probe:
    """What our model and a reference run: ``inputs`` of one forward pass (src and tgt; prompts;
    ids and types), ``keep`` the (B, T) positions where per-token outputs are compared (an
    encoder's unpadded ones), ``prompts`` what a language model continues greedily (None: its
    inputs), ``targets`` outputs whose sequence log-probs are compared (one per source)."""

    inputs: tuple[Tensor | None, ...]
    keep: Tensor | None = None
    prompts: Tensor | None = None
    targets: list[list[int]] | None = None


def encoder_probe(ids: Tensor, types: Tensor | None, pad_id: int) -> Probe:
    """An encoder's probe of padded ``ids`` (B, T), compared at the unpadded positions."""
    return Probe((ids, types), keep=ids != pad_id)


def default_probe(model) -> Probe:
    """The probe of ``model``'s kind: 6 sources and targets, 6 prompts of 7 tokens, or 6 padded
    encoder rows (:func:`probe_sources`, :func:`probe_prompts`, :func:`probe_inputs`)."""
    cfg = model.config
    if cfg.family.translates:
        src = probe_sources(model)
        return Probe((src, probe_targets(model, src.shape[0])))
    if cfg.family.generates:
        return Probe((probe_prompts(cfg, length=min(7, cfg.max_positions - 1)),))
    return encoder_probe(*probe_inputs(cfg), cfg.pad_id)


# The outputs a reference gives: name -> (the check's key, what an error calls it). Per-token ones
# are compared at a probe's ``keep`` positions.
OUTPUTS = {"logits": ("max_logit_diff", "logits"), "mlm_logits": ("max_logit_diff", "masked-LM logits"),
           "class_logits": ("max_class_logit_diff", "class logits"),
           "nsp_logits": ("max_nsp_logit_diff", "next-sentence logits"),
           "states": ("max_state_diff", "final states"), "pooled": ("max_pooled_diff", "pooled output"),
           "sequence_logprobs": ("max_logprob_diff", "sequence log-probs")}
PER_TOKEN = ("mlm_logits", "states")


class Reference:
    """What our model is checked against (transformers' model, ONNX Runtime, CTranslate2), in our
    ids: ``outputs(probe)``, its outputs on a probe by name (:data:`OUTPUTS`); a translation
    model's ``search(src, beam, max_len)``, greedy (beam 1) or beam outputs with EOS, ``beams`` the
    searches compared, ``stop`` its beam search's stopping rule in our terms and ``renormalized``
    whether its softmax leaves out PAD and BOS (:func:`check_same_outputs`); a language model's
    ``generate(prompts, new)``, greedy continuations without EOS."""

    beams, stop, renormalized = (1, 4), "k_finished", False


def eager_outputs(model, probe: Probe, names) -> dict[str, Tensor]:
    """Our model's outputs ``names`` on ``probe``: of its forward pass (logits, or an encoder's
    final states, which the heads read), or the log-probs of ``probe.targets``."""
    if "sequence_logprobs" in names:
        return {"sequence_logprobs": torch.tensor([sequence_log_prob(model, probe.inputs[0][i], t)
                                                   for i, t in enumerate(probe.targets)])}
    out = model(*probe.inputs)
    head = getattr(model, "cls_head", None) or getattr(model, "nsp_head", None)
    make = {"logits": lambda: out, "states": lambda: out, "mlm_logits": lambda: model.mlm_logits(out),
            "class_logits": lambda: model.classify(out), "nsp_logits": lambda: model.next_sentence_logits(out),
            "pooled": lambda: torch.tanh(head.pooler(out[:, 0]))}
    return {name: make[name]() for name in names}


@torch.no_grad()
def check_against(model, reference: Reference, probe: Probe, what: str, atol: float = LOGIT_TOL,
                  max_len: int = 12) -> dict[str, object]:
    """``model`` against ``reference`` on ``probe``, named ``what`` in errors: each output the
    reference gives within ``atol`` of ours; a translation model's greedy and beam outputs
    (``reference.beams``) the same up to near ties (:func:`check_same_outputs`); a language
    model's greedy continuations of at most ``max_len`` tokens identical. Returns the
    measurements; raises ExportError at the first failure."""
    cfg = model.config
    searches = reference.beams if cfg.family.translates else (1,) if cfg.family.generates else ()
    with progress_bar(1 + len(searches), unit="checks", desc="verifying") as bar:
        theirs = reference.outputs(probe)
        ours = eager_outputs(model, probe, theirs)
        checks: dict[str, object] = {}
        for name, got in theirs.items():
            want = ours[name]
            if name in PER_TOKEN and probe.keep is not None:
                got, want = got[probe.keep], want[probe.keep]
            key, label = OUTPUTS[name]
            checks[key] = check_close(f"{what} {label}", got, want, atol)
        bar.update()
        if cfg.family.generates:
            prompts = probe.inputs[0] if probe.prompts is None else probe.prompts
            new = min(max_len, cfg.max_positions - prompts.shape[1])
            want = generate_ids(model, prompts, GenerationConfig(max_new_tokens=new, temperature=0))
            differences = sum(a != b for a, b in zip(reference.generate(prompts, new), want))
            if differences:
                raise ExportError(f"verification failed: {what} greedy output differs from ours in {differences} "
                                  f"of {len(want)} prompts")
            checks["greedy_differences"] = differences
            bar.update()
        for beam in searches if cfg.family.translates else ():
            src = probe.inputs[0]
            want = search_ids(model, src, beam, max_len, stop=reference.stop)
            name = "greedy" if beam == 1 else "beam"
            checks[f"{name}_differences"] = check_same_outputs(
                f"{what} {name}", model, src, want, reference.search(src, beam, max_len), beam=beam > 1,
                renormalized=reference.renormalized)
            bar.update()
    return checks


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

    decode = DecodeConfig(beam=beam, lenpen=lenpen, max_len_a=0.0, max_len_b=max_len, stop=stop)
    with torch.no_grad():
        out = greedy_search(model, src, decode) if beam == 1 else beam_search(model, src, decode)
    return [out.hypothesis(i) for i in range(src.shape[0])]
