"""Scoring given translations (``transduce score``): forced decoding of (source, target) pairs,
text in, scores out.

Each pair's total log-probability, the length-normalised score beam search would rank it by
(:mod:`~transduce.inference.search.forced`), and with ``jsonl`` output each target piece's
log-probability (EOS last). An empty target line is the empty translation: its score is that of
EOS alone. An empty source line is scored as the empty source (EOS alone), as the model sees it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Sequence

import torch

from ..config import DecodeConfig
from ..data.batch import pad
from ..data.corpus import read_lines
from ..errors import ConfigError, DataError
from .files import atomic_output, one_line, reporting
from ..progress import Progress
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
    :class:`Scored` per pair, in order), batched by source length."""
    if len(sources) != len(targets):
        raise ConfigError(f"score: {len(sources)} sources for {len(targets)} targets (one target per source)")
    cfg, tok = translator.config, translator.tokenizer
    src_ids = [translator.encode_source(s, decode.max_input_len)[0] + [cfg.eos_id] for s in sources]
    tgt_ids = [tok.encode(t, side="tgt") + [cfg.eos_id] if t else [cfg.eos_id] for t in targets]
    cap = getattr(cfg, "max_positions", None) if getattr(cfg, "positions", None) == "learned" else None
    for n, ids in enumerate(tgt_ids, 1):
        if cap is not None and len(ids) > cap:
            raise ConfigError(f"score: target {n} has {len(ids)} tokens; the model's learned positions hold {cap}")
    lengths = [len(s) + len(t) for s, t in zip(src_ids, tgt_ids)]
    results: list[Scored | None] = [None] * len(sources)
    for index in translator._batches(lengths, decode.batch_tokens):
        out = translator._force(pad([src_ids[i] for i in index], cfg.pad_id),
                                pad([tgt_ids[i] for i in index], cfg.pad_id), decode)
        for row, i in enumerate(index):
            results[i] = _scored(translator, out, row, tgt_ids[i])
        if translator.progress is not None:
            translator.progress.advance(len(index))
    return results


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


def score_files(translator, src_path: str | os.PathLike, tgt_path: str | os.PathLike,
                output_path: str | os.PathLike | None, output_format: str = "text",
                decode: DecodeConfig | None = None) -> int:
    """Score the aligned lines of two files into a file (or stdout); returns the pairs scored. A
    one-line DataError when the files differ in length."""
    decode = decode or translator.decode
    sources, targets = list(read_lines(src_path)), list(read_lines(tgt_path))
    if len(sources) != len(targets):
        raise DataError(f"{tgt_path}: has {len(targets)} lines, {src_path} has {len(sources)} (one target per source)")
    with atomic_output(output_path) as out, reporting(translator, Progress(len(sources), unit="pairs")):
        with torch.inference_mode():
            scored = score_pairs(translator, sources, targets, decode)
        out.write("".join(one_line(format_scored(s, output_format)) + "\n" for s in scored))
    return len(scored)
