"""Scoring given translations (``transduce score``): forced decoding of (source, target) pairs,
text in, scores out; and the per-token log-probabilities of ``translate --output-format jsonl``.

Each pair's total log-probability, the length-normalised score beam search would rank it by
(:mod:`~transduce.inference.search.forced`), and with ``jsonl`` output each target piece's
log-probability (EOS last). An empty target line is the empty translation: its score is that of
EOS alone. An empty source line is scored as the empty source (EOS alone), as the model sees it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Iterator, Sequence

from ..config import DecodeConfig
from ..data.batch import pad
from ..data.multilingual import source_texts
from ..errors import ConfigError
from .search.common import AttentionChoice
from .search.forced import ForcedOutput


@dataclass
class Scored:
    """One scored pair.

    Attributes:
        log_prob: log P(target | source) under the model (EOS included).
        score: ``log_prob`` divided by the GNMT length penalty (``decode.lenpen``), the score
            beam search reports for the same output.
        pieces: the target's subword pieces, then ``</s>`` (EOS).
        token_log_probs: the log-probability of each of ``pieces``.
    """

    log_prob: float
    score: float
    pieces: list[str]
    token_log_probs: list[float]


def score_pairs(translator, sources: Sequence[str], targets: Sequence[str], decode: DecodeConfig) -> list[Scored]:
    """Score ``targets`` as translations of ``sources`` with ``translator`` (one
    :class:`Scored` per pair, in order), batched by source length; a multilingual model's
    sources tagged with ``decode.tgt_lang`` as translation tags them (an imported NLLB model's
    language codes: the source's first, the target's scored as the output's first token)."""
    if len(sources) != len(targets):
        raise ConfigError(f"score: {len(sources)} sources for {len(targets)} targets (one target per source)")
    cfg, tok = translator.config, translator.tokenizer
    sources, lead, forced = source_texts(sources, decode, tok)  # (an NLLB model's language codes: lead, forced)
    src_ids = [lead + translator.encode_source(s, decode.max_input_len)[0] + [cfg.eos_id] for s in sources]
    tgt_ids = [forced + tok.encode(t, side="tgt") + [cfg.eos_id] if t else forced + [cfg.eos_id] for t in targets]
    cap = getattr(cfg, "max_positions", None) if getattr(cfg, "positions", None) == "learned" else None
    for n, ids in enumerate(tgt_ids, 1):
        if cap is not None and len(ids) > cap:
            raise ConfigError(f"score: target {n} has {len(ids)} tokens; the model's learned positions hold {cap}")
    results: list[Scored | None] = [None] * len(sources)
    for index, out in forced_batches(translator, src_ids, tgt_ids, decode):
        for row, i in enumerate(index):
            results[i] = _scored(translator, out, row, tgt_ids[i])
        if translator.progress is not None:
            translator.progress.update(len(index))
    return results


def forced_batches(translator, src_ids: list[list[int]], tgt_ids: list[list[int]], decode: DecodeConfig,
                   attention: AttentionChoice | None = None) -> Iterator[tuple[list[int], ForcedOutput]]:
    """Force-decode the pairs of id lists (sources with EOS; non-empty targets) in length-sorted
    batches: (the batch's indices, its :class:`ForcedOutput`, with the ``attention`` asked
    for) each."""
    cfg = translator.config
    lengths = [len(s) + len(t) for s, t in zip(src_ids, tgt_ids)]
    for index in translator._batches(lengths, decode.batch_tokens):
        yield index, translator._force(pad([src_ids[i] for i in index], cfg.pad_id),
                                       pad([tgt_ids[i] for i in index], cfg.pad_id), decode, attention)


def translation_json(t, token_log_probs: list[float], alignment: str | None = None) -> str:
    """One ``translate --output-format jsonl`` line: the best translation, its score and
    log-probability, its pieces (``</s>`` last when it ended) and their log-probabilities, its
    word alignment (``"i-j ..."``, see :mod:`~transduce.inference.text.alignment`) when given, and
    with an n-best list every hypothesis' text and scores."""
    best = t.best
    row = {"translation": best.text, "score": round(best.score, 6), "log_prob": round(best.log_prob, 6),
           "pieces": list(best.pieces) + ["</s>"] * best.ended,
           "token_log_probs": [round(x, 6) for x in token_log_probs]}
    if alignment is not None:
        row["alignment"] = alignment
    if len(t.hypotheses) > 1:
        row["hypotheses"] = [{"translation": h.text, "score": round(h.score, 6), "log_prob": round(h.log_prob, 6),
                              **({} if h.utility is None else {"utility": round(h.utility, 4)})} for h in t.hypotheses]
    return json.dumps(row, ensure_ascii=False)


def _scored(translator, out: ForcedOutput, row: int, ids: list[int]) -> Scored:
    pieces = translator.tokenizer.pieces(ids[:-1], side="tgt") + ["</s>"]
    return Scored(float(out.log_probs[row]), float(out.scores[row]), pieces,
                  out.token_log_probs[row, : len(ids)].tolist())


def format_scored(s: Scored, output_format: str) -> str:
    """One output line: ``LOG_PROB<TAB>SCORE``, or a JSON object with the pieces too."""
    if output_format == "jsonl":
        return json.dumps({"log_prob": round(s.log_prob, 6), "score": round(s.score, 6), "pieces": s.pieces,
                           "token_log_probs": [round(x, 6) for x in s.token_log_probs]}, ensure_ascii=False)
    return f"{s.log_prob:.6f}\t{s.score:.6f}"
