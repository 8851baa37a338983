"""Attention health over a file of sentences: per layer, head and kind (encoder self-, decoder
self-, cross-attention), how spread out the attention is and where it lands.

Each pair (a source and its translation by the model, or a given target) is force-decoded once
with ``need_weights=True``, in length-sorted padded batches. For every real query:

- **entropy**, over the keys the query may see (padding never; in the causal decoder
  self-attention the prefix up to the query), divided by the log of their number, so that a
  uniform query scores 1.0 and a one-hot query 0.0. Queries with a single key (the decoder's
  first, a source of EOS alone) have no defined entropy and are left out of every figure;
- the **maximum weight**;
- where its **argmax** lands, and whether at least ``collapse`` of its weight sits on one
  *position class*: ``bos`` (key 0 of the decoder self-attention: the ``<s>`` every target
  starts with), ``eos`` (the source's last key, ``</s>``), or a fixed offset from the query's
  own position: ``prev`` (-1), ``same`` (0), ``next`` (+1; not in the causal decoder). A key can
  be in two classes at once (the decoder's query 1 sees ``<s>`` as ``bos`` and ``prev``).

A head is flagged ``uniform`` when at least ``share`` of its queries have an entropy of
``uniform`` or more, and ``collapsed:CLASS`` when at least ``share`` of its queries put
``collapse`` or more of their weight on CLASS. Cross-attention is also compared with word
order: ``monotonicity`` is the correlation of each target token's relative position with its
argmax source token's relative position (EOS row and column left out, pooled over the file).
It says the head walks the source in step with the target, not that it aligns words: a head
that attends by position alone scores as high on a word-for-word pair. Where reference word
alignments are given, ``aer`` is the alignment error rate of the head's hard alignment
(:func:`~transduce.inference.text.alignment.hard_alignment`) against them, every link taken as sure.

Legend: B sentences, L layers, H heads, Tq queries, Tk keys.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Sequence

import torch
from torch import Tensor

from ...config import DecodeConfig
from ...data.batch import pad
from ...data.corpus import read_lines
from ...data.multilingual import tag_length, with_tag
from ...errors import ConfigError, DataError
from ..text.alignment import hard_alignment, parse_alignment
from ..decode_batches import length_sorted_batches

KINDS = ("encoder", "decoder", "cross")
CLASSES = {"encoder": ("eos", "prev", "same", "next"), "decoder": ("bos", "prev", "same"),
           "cross": ("eos", "prev", "same", "next")}
OFFSETS = {"prev": -1, "same": 0, "next": 1}


@dataclass(frozen=True)
class HealthLimits:
    """The thresholds of the flags (each in (0, 1]).

    Attributes:
        uniform: a query whose normalised entropy is at least this is near-uniform.
        collapse: a query that puts at least this weight on one position class collapses onto it.
        share: a head is flagged when at least this share of its queries are near-uniform
            (``uniform``), or collapse onto the same class (``collapsed:CLASS``).
    """

    uniform: float = 0.95
    collapse: float = 0.5
    share: float = 0.9

    def __post_init__(self):
        for name in ("uniform", "collapse", "share"):
            value = getattr(self, name)
            if not 0.0 < value <= 1.0:
                raise ConfigError(f"attention stats: {name} must be in (0, 1]; got {value}")


@dataclass
class HeadStats:
    """One head's figures over the file (means and shares over its counted queries).

    Attributes:
        kind: "encoder", "decoder" (self-attention) or "cross".
        layer, head: indices from 0.
        queries: the queries counted (those with two keys or more).
        entropy: mean normalised entropy (1.0: uniform over the keys, 0.0: one key).
        max_weight: mean of each query's largest weight.
        uniform_max_weight: what ``max_weight`` would be for uniform attention (the mean of
            1 / keys over the same queries): the floor to compare ``max_weight`` with.
        uniform_share: share of queries whose normalised entropy is at least ``limits.uniform``.
        argmax: per position class, the share of queries whose largest weight is on it (a
            query whose largest weight is tied, within 1e-6, counts for none).
        collapse: per position class, the share of queries with ``limits.collapse`` of their weight on it.
        flags: "uniform" and/or "collapsed:CLASS".
        monotonicity: cross only: the correlation of argmax source position with target position
            (None: no sentence of two source and two target words, or a constant argmax).
        aer: cross only, with reference alignments: the alignment error rate of the head's links.
    """

    kind: str
    layer: int
    head: int
    queries: int
    entropy: float
    max_weight: float
    uniform_max_weight: float
    uniform_share: float
    argmax: dict[str, float]
    collapse: dict[str, float]
    flags: list[str] = field(default_factory=list)
    monotonicity: float | None = None
    aer: float | None = None


@dataclass
class AttentionStats:
    """The figures of every head, in the order kind, layer, head; ``sentences``: how many pairs
    they come from (empty sources are skipped); ``targets``: "translations" or "references"."""

    heads: list[HeadStats]
    sentences: int
    targets: str
    limits: HealthLimits

    def flagged(self, flag: str = "uniform") -> list[tuple[str, int, int]]:
        """(kind, layer, head) of every head with ``flag`` (or a flag starting with it, "collapsed")."""
        return [(h.kind, h.layer, h.head) for h in self.heads if any(f.startswith(flag) for f in h.flags)]

    def to_dict(self) -> dict:
        """Plain data for JSON."""
        return {"sentences": self.sentences, "targets": self.targets, "limits": asdict(self.limits),
                "heads": [asdict(h) for h in self.heads]}


def query_figures(weights: Tensor, q_len: Tensor, k_len: Tensor, causal: bool, classes: Sequence[str]
                  ) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-query figures of one attention map of a padded batch.

    Args:
        weights: (B, H, Tq, Tk) attention weights (rows sum to 1 over the real keys).
        q_len, k_len: (B,) real queries and keys of each row; causal: query t sees keys 0..t.
        classes: the position classes to measure (see the module docstring).

    Returns:
        ``used`` (B, Tq): queries with two keys or more; and (B, H, Tq) tensors: ``entropy``
        (normalised), ``max_weight``, ``uniform_max_weight`` (1 / the query's keys: a uniform
        head's maximum weight), and per class ``argmax:C`` (0/1: the largest weight, untied, is
        on C) and ``weight:C``.
    """
    w = weights.float()
    b, _, tq, tk = w.shape
    q_pos, k_pos = torch.arange(tq, device=w.device), torch.arange(tk, device=w.device)
    n_keys = k_len[:, None].expand(b, tq)                                             # (B, Tq)
    if causal:
        n_keys = torch.minimum(n_keys, q_pos[None, :] + 1)
    used = (q_pos[None, :] < q_len[:, None]) & (n_keys >= 2)                          # (B, Tq)
    p = w.masked_fill(~(k_pos[None, None, :] < n_keys[:, :, None])[:, None], 0.0)     # (B, H, Tq, Tk)
    entropy = -torch.special.xlogy(p, p).sum(-1) / n_keys.clamp_min(2).log()[:, None]  # (B, H, Tq)
    top, arg = p.max(dim=-1)                                                          # (B, H, Tq)
    unique = (p >= top[..., None] - 1e-6).sum(-1) == 1  # a tie (a uniform head) has no argmax class
    out = {"entropy": entropy, "max_weight": top, "uniform_max_weight": (1.0 / n_keys)[:, None].expand_as(top)}
    for name in classes:
        if name == "bos":
            pos = torch.zeros_like(n_keys)
        elif name == "eos":
            pos = (k_len - 1)[:, None].expand(b, tq)
        else:
            pos = q_pos[None, :].expand(b, tq) + OFFSETS[name]
        valid = ((pos >= 0) & (pos < n_keys))[:, None]                                   # (B, 1, Tq)
        index = pos.clamp(0, tk - 1)[:, None, :, None].expand(b, p.shape[1], tq, 1)      # (B, H, Tq, 1)
        out[f"weight:{name}"] = p.gather(-1, index)[..., 0] * valid
        out[f"argmax:{name}"] = ((arg == pos[:, None]) & valid & unique).float()
    return used, out


class HeadTally:
    """Sums of the per-query figures of one kind's layers over the batches, per (layer, head)."""

    def __init__(self, kind: str, layers: int, heads: int):
        self.kind, self.classes = kind, CLASSES[kind]
        self.count = torch.zeros(layers, heads)
        self.sums: dict[str, Tensor] = {}
        self.moments = torch.zeros(layers, heads, 6, dtype=torch.float64)  # n, Σx, Σy, Σxx, Σyy, Σxy
        self.links = torch.zeros(layers, heads, 3, dtype=torch.float64)    # |A & S|, |A|, |S|
        self.aligned = False

    def add(self, layer: int, weights: Tensor, q_len: Tensor, k_len: Tensor, limits: HealthLimits) -> None:
        """Count one layer's (B, H, Tq, Tk) map of a batch."""
        used, figures = query_figures(weights, q_len, k_len, self.kind == "decoder", self.classes)
        mask = used[:, None].float()                                                     # (B, 1, Tq)
        self.count[layer] += float(used.sum())
        figures["uniform"] = (figures["entropy"] >= limits.uniform).float()
        for name in self.classes:
            figures[f"collapse:{name}"] = (figures[f"weight:{name}"] >= limits.collapse).float()
        for name, value in figures.items():
            if name.startswith("weight:"):
                continue
            total = (value * mask).sum(dim=(0, 2)).cpu()                                 # (H,)
            self.sums.setdefault(name, torch.zeros_like(self.count))[layer] += total

    def add_order(self, layer: int, cross: Tensor, spans: Sequence[tuple[int, int, int]]) -> None:
        """Pool each sentence's (target position, argmax source position), both relative, for the
        monotonicity; ``spans``: per row (first source column, source words' end column, target
        tokens), the EOS row and column outside them."""
        for row, (first, end, n_tgt) in enumerate(spans):
            if end - first < 2 or n_tgt < 2:
                continue
            arg = cross[row, :, :n_tgt, first:end].float().argmax(dim=-1).double().cpu()   # (H, T)
            x = torch.arange(n_tgt, dtype=torch.float64) / (n_tgt - 1)                      # (T,)
            y = arg / (end - first - 1)
            self.moments[layer] += torch.stack([torch.full_like(y[:, 0], n_tgt), x.sum().expand_as(y[:, 0]),
                                                y.sum(-1), (x * x).sum().expand_as(y[:, 0]), (y * y).sum(-1),
                                                (x * y).sum(-1)], dim=-1)

    def add_links(self, layer: int, head: int, links: Sequence[tuple[int, int]],
                  reference: Sequence[tuple[int, int]]) -> None:
        """Count one sentence's predicted and reference word links for the AER."""
        a, s = set(links), set(reference)
        self.links[layer, head] += torch.tensor([len(a & s), len(a), len(s)], dtype=torch.float64)
        self.aligned = True

    def heads(self, limits: HealthLimits) -> list[HeadStats]:
        """The :class:`HeadStats` of every (layer, head), flags set by ``limits``."""
        layers, heads = self.count.shape
        return [self.head(layer, head, limits) for layer in range(layers) for head in range(heads)]

    def head(self, layer: int, head: int, limits: HealthLimits) -> HeadStats:
        """One head's :class:`HeadStats`."""
        n = float(self.count[layer, head])
        mean = {name: (float(s[layer, head]) / n if n else 0.0) for name, s in self.sums.items()}
        stats = HeadStats(self.kind, layer, head, int(n), mean.get("entropy", 0.0), mean.get("max_weight", 0.0),
                          mean.get("uniform_max_weight", 0.0), mean.get("uniform", 0.0),
                          {c: mean.get(f"argmax:{c}", 0.0) for c in self.classes},
                          {c: mean.get(f"collapse:{c}", 0.0) for c in self.classes})
        if n:
            stats.flags = (["uniform"] * (stats.uniform_share >= limits.share)
                           + [f"collapsed:{c}" for c, v in stats.collapse.items() if v >= limits.share])
        if self.kind == "cross":
            stats.monotonicity = _correlation(self.moments[layer, head])
            a_s, n_a, n_s = self.links[layer, head].tolist()
            stats.aer = (1.0 - 2 * a_s / (n_a + n_s) if n_a + n_s else 0.0) if self.aligned else None
        return stats


def _correlation(m: Tensor) -> float | None:
    """Pearson's r from (n, Σx, Σy, Σxx, Σyy, Σxy); None when undefined."""
    n, sx, sy, sxx, syy, sxy = m.tolist()
    vx, vy = n * sxx - sx * sx, n * syy - sy * sy
    if n < 2 or vx <= 1e-12 or vy <= 1e-12:
        return None
    return (n * sxy - sx * sy) / (vx * vy) ** 0.5


@dataclass
class _Pair:
    """One pair as the model sees it: ids without EOS (source) and BOS (target), their pieces,
    the leading target-language tag's length, and its reference links (None: none given)."""

    src: list[int]
    tgt: list[int]
    src_pieces: list[str]
    tgt_pieces: list[str]
    skip: int
    reference: list[tuple[int, int]] | None = None


def attention_stats(translator, sources: Sequence[str], targets: Sequence[str] | None = None,
                    alignments: Sequence[Sequence[tuple[int, int]]] | None = None,
                    limits: HealthLimits = HealthLimits(), decode: DecodeConfig | None = None,
                    **overrides) -> AttentionStats:
    """Attention health of ``translator``'s model (an in-process
    :class:`~transduce.inference.Translator`) over ``sources``: each translated with ``decode``
    (default the translator's settings, and ``overrides`` of its fields), or paired with the
    given ``targets``; ``alignments`` (needs ``targets``): reference word links of each pair
    (``(source word, target word)``, Pharaoh's ``i-j``) for each cross-attention head's AER.
    Sentences with an empty source are skipped. See the module docstring for the figures."""
    model = getattr(translator, "model", None)
    if model is None or not hasattr(model, "encode"):
        raise ConfigError("attention stats: needs a model in this process (a Translator, not a pool)")
    if alignments is not None and targets is None:
        raise ConfigError("attention stats: reference alignments need the targets they link (targets)")
    decode = translator.settings(decode, **overrides)
    pairs = _pairs(translator, sources, targets, alignments, decode)
    if not pairs:
        raise ConfigError("attention stats: no sentence with a non-empty source")
    cfg = model.config
    shape = {"encoder": cfg.n_encoder_layers, "decoder": cfg.n_decoder_layers, "cross": cfg.n_decoder_layers}
    tallies = {kind: HeadTally(kind, n, cfg.n_heads) for kind, n in shape.items()}
    for index in length_sorted_batches([len(p.src) + len(p.tgt) + 2 for p in pairs], decode.batch_tokens):
        _tally_batch(translator, [pairs[i] for i in index], tallies, limits)
    heads = [h for kind in KINDS for h in tallies[kind].heads(limits)]
    return AttentionStats(heads, len(pairs), "translations" if targets is None else "references", limits)


def _pairs(translator, sources: Sequence[str], targets: Sequence[str] | None, alignments, decode: DecodeConfig
           ) -> list[_Pair]:
    """The non-empty-source pairs to measure, with their reference links."""
    tok, cfg = translator.tokenizer, translator.config
    tag_ids = set(getattr(tok, "lang_tags", {}).values())
    for name, other in (("targets", targets), ("alignments", alignments)):
        if other is not None and len(other) != len(sources):
            raise ConfigError(f"attention stats: {len(sources)} sources for {len(other)} {name} (one per source)")
    if targets is None:
        pairs = [_Pair(r.source_tokens, r.best.tokens, r.source_pieces, r.best.pieces, 0)
                 for r in translator.translate_detailed(list(sources), decode, scores=False)]
    else:
        pairs = []
        for text, target in zip(with_tag(sources, decode.tgt_lang, getattr(tok, "lang_tags", {})), targets):
            src = translator.encode_source(text, decode.max_input_len)[0]
            tgt = tok.encode(target, side="tgt") if target else []
            pairs.append(_Pair(src, tgt, tok.pieces(src, side="src"), tok.pieces(tgt, side="tgt"), 0))
    cap = getattr(cfg, "max_positions", None) if getattr(cfg, "positions", None) == "learned" else None
    for n, pair in enumerate(pairs):
        pair.skip = tag_length(pair.src, pair.src_pieces, tag_ids)
        pair.reference = None if alignments is None else list(alignments[n])
        if cap is not None and len(pair.tgt) + 1 > cap:
            raise ConfigError(f"attention stats: target {n + 1} has {len(pair.tgt)} tokens; the model's learned "
                              f"positions hold {cap - 1} after <s>")
    return [p for p in pairs if p.src]


def _tally_batch(translator, batch: list[_Pair], tallies: dict[str, HeadTally], limits: HealthLimits) -> None:
    """Force-decode one batch with the weights on and add its maps to ``tallies``."""
    model, cfg, device = translator.model, translator.config, translator.device
    src = pad([p.src + [cfg.eos_id] for p in batch], cfg.pad_id).to(device)            # (B, S)
    tgt = pad([[cfg.bos_id] + p.tgt for p in batch], cfg.pad_id).to(device)            # (B, T)
    with torch.inference_mode(), translator.autocast():
        enc = model.encode(src, need_weights=True)
        dec = model.decode(tgt, enc, need_weights=True, project=False)
    s_len = torch.tensor([len(p.src) + 1 for p in batch], device=device)
    t_len = torch.tensor([len(p.tgt) + 1 for p in batch], device=device)
    for layer, w in enumerate(enc.attentions):
        tallies["encoder"].add(layer, w, s_len, s_len, limits)
    spans = [(p.skip, len(p.src), len(p.tgt)) for p in batch]
    for layer, (sw, cw) in enumerate(zip(dec.self_attentions, dec.cross_attentions)):
        tallies["decoder"].add(layer, sw, t_len, t_len, limits)
        tallies["cross"].add(layer, cw, t_len, s_len, limits)
        tallies["cross"].add_order(layer, cw, spans)
        for row, p in enumerate(batch):
            if p.reference is None:
                continue
            for head in range(cw.shape[1]):
                links = hard_alignment(cw[row, head, :, p.skip:].cpu(), p.src_pieces[p.skip:], p.tgt_pieces)
                tallies["cross"].add_links(layer, head, links, p.reference)


def format_attention_stats(stats: AttentionStats) -> str:
    """A plain table, one line a head: its figures, its most frequent argmax class and flags.
    Columns: normalised entropy, mean max weight, (the same for uniform attention), share of
    near-uniform queries, top argmax class and its share, monotonicity, AER, flags."""
    lines = [f"attention health over {stats.sentences} sentences ({stats.targets}); entropy 1.0 = uniform",
             f"{'kind':<8} {'layer':>5} {'head':>4} {'entropy':>7} {'max_w':>5} {'(unif)':>6} {'near-u':>6} "
             f"{'top argmax':<11} {'monot':>6} {'aer':>5}  flags"]
    for h in stats.heads:
        top = max(h.argmax, key=h.argmax.get)
        mono = "-" if h.monotonicity is None else f"{h.monotonicity:.2f}"
        aer = "-" if h.aer is None else f"{h.aer:.2f}"
        lines.append(f"{h.kind:<8} {h.layer:>5} {h.head:>4} {h.entropy:>7.3f} {h.max_weight:>5.2f} "
                     f"{h.uniform_max_weight:>6.2f} {h.uniform_share:>6.2f} {top + f' {h.argmax[top]:.2f}':<11} "
                     f"{mono:>6} {aer:>5}  {' '.join(h.flags) or '-'}")
    return "\n".join(lines)


def attention_stats_files(translator, src: str | os.PathLike, tgt: str | os.PathLike | None = None,
                          align: str | os.PathLike | None = None, limits: HealthLimits = HealthLimits(),
                          **overrides) -> AttentionStats:
    """:func:`attention_stats` of the lines of ``src`` (UTF-8, plain or gzip), with the
    targets of ``tgt`` and the Pharaoh ``i-j`` links of ``align`` (needs ``tgt``) when given;
    a one-line error for a missing, empty or invalid file."""
    if align is not None and tgt is None:
        raise ConfigError("--align: the links are between --src and --tgt lines; give --tgt too")
    sources = list(read_lines(src))
    if not any(line.strip() for line in sources):
        raise DataError(f"{src}: no sentences (the file is empty)")
    targets = None if tgt is None else list(read_lines(tgt))
    links = None if align is None else [parse_alignment(line, f"{align}:{n}")
                                        for n, line in enumerate(read_lines(align), 1)]
    for path, lines in ((tgt, targets), (align, links)):
        if lines is not None and len(lines) != len(sources):
            raise DataError(f"{path}: {len(lines)} lines for the {len(sources)} of {src}")
    return attention_stats(translator, sources, targets, links, limits, **overrides)
