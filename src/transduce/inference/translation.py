"""The text side of translation, whatever runs the search: a call's decoding settings, tokenize,
batch by length, detokenize, restore input order (:class:`BaseTranslator`), and its results
(:class:`Translation`, :class:`Hypothesis`). :class:`~transduce.inference.translator.Translator`
runs the searches in this process, :class:`~transduce.inference.pool.TranslatorPool` in worker
processes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from typing import TYPE_CHECKING, Iterator, Sequence

import torch
from torch import Tensor

from ..config import DecodeConfig
from ..data.alignments import word_continuations
from ..data.batch import pad
from ..errors import ConfigError
from ..tracing import DATA, scope
from .scoring import score_pairs
from .text.alignment import add_alignments, translate_markup
from .decode_batches import length_sorted_batches
from .search.common import AttentionChoice, SearchOutput, StepHook, prefix_ids
from .search.constraints import constraint_ids
from .search.dispatch import SearchSpec
from .search.forced import ForcedOutput
from .search.sampling import check_sampling
from .search.rerank import mbr_rerank, reverse_rerank
from ..data.multilingual import source_texts

if TYPE_CHECKING:
    from tqdm import tqdm

logger = logging.getLogger(__name__)


@dataclass
class Hypothesis:
    """One output of the search.

    Attributes:
        text: detokenized output.
        tokens: target ids, without BOS and EOS.
        pieces: subword strings of ``tokens``.
        score: the ranking score (length-normalised log-prob for beam search).
        log_prob: sum of the token log-probabilities.
        ended: whether the hypothesis ended with EOS (False: it hit the length limit).
        utility: the reranking value when the n-best list was reranked: the expected utility
            (MBR) or score + weight x the reverse model's score (noisy channel); else None.
        attention: (T, S) cross-attention, rows = ``tokens`` (+ EOS if ``ended``), columns =
            the source tokens + EOS; None unless asked for.
        alignment: (source word, target word) links of the best hypothesis when asked for
            (:mod:`~transduce.inference.text.alignment`), else None.
    """

    text: str
    tokens: list[int]
    pieces: list[str]
    score: float
    log_prob: float
    ended: bool = True
    attention: Tensor | None = None
    utility: float | None = None
    alignment: list[tuple[int, int]] | None = None


@dataclass
class Translation:
    """The n-best hypotheses of one input line, best first."""

    source: str
    source_tokens: list[int]
    source_pieces: list[str]
    hypotheses: list[Hypothesis] = field(default_factory=list)
    truncated: bool = False

    @property
    def best(self) -> Hypothesis:
        return self.hypotheses[0]


def check_layer_head(config, layer: int, head: int | None, key: str = "attention layer") -> None:
    """A ConfigError unless ``layer`` indexes every stack of ``config`` (negative from the top)
    and ``head`` is a head index or None (the mean of heads)."""
    for name in ("encoder", "decoder"):
        n = getattr(config, f"n_{name}_layers", None)
        if n is not None and not -n <= layer < n:
            raise ConfigError(f"{key}: must be in [{-n}, {n}) for the {n}-layer {name}; got {layer}")
    n_heads = getattr(config, "n_heads", None)
    if head is not None and n_heads is not None and not 0 <= head < n_heads:
        raise ConfigError(f"attention head: must be in [0, {n_heads}); got {head}")


class BaseTranslator:
    """The text side of translation: tokenize, batch by length, detokenize, restore input order.

    Subclasses say where the searches run: :class:`Translator` in this process,
    :class:`~transduce.inference.pool.TranslatorPool` in worker processes. They set
    ``tokenizer``, ``config`` (the model's :class:`~transduce.config.ModelConfig`) and ``decode``
    (the default :class:`~transduce.config.DecodeConfig`, whose fields each call may replace),
    and implement :meth:`_search`.
    """

    tokenizer: object
    config: object
    decode: DecodeConfig
    progress: tqdm | None = None  # advanced by each batch's sentences (e.g. translate_file's bar)
    reverse: "BaseTranslator | None" = None  # a target->source model, for decode.rerank == "reverse"
    on_step: StepHook | None = None  # told each search step's settled tokens (in-process searches; streaming)

    def _search(self, batches: list[Tensor], spec: SearchSpec, prefixes: list[Tensor | None] | None = None,
                constraints: list[Tensor | None] | None = None, inside: Tensor | None = None) -> Iterator[SearchOutput]:
        """One CPU :class:`SearchOutput` per (B, S) batch of source ids, in order (with each batch's
        forced-prefix ids and constraint ids, if given; whole words with ``inside``, :attr:`word_pieces`)."""
        raise NotImplementedError

    @cached_property
    def word_pieces(self) -> Tensor | None:
        """(V,) bool or None: :func:`~transduce.data.alignments.word_continuations` (whole-word constraints)."""
        table = word_continuations(self.tokenizer, "tgt", self.config.tgt_vocab_size)
        return None if table is None else torch.from_numpy(table)

    def _batches(self, lengths: list[int], batch_tokens: int) -> list[list[int]]:
        """Indices of ``lengths`` grouped into the batches to search."""
        return length_sorted_batches(lengths, batch_tokens)

    def _force(self, src: Tensor, tgt: Tensor, decode: DecodeConfig, attention: AttentionChoice | None = None
               ) -> ForcedOutput:
        """Forced decoding of a (B, S) batch of source ids and (B, T) target ids, with the
        cross-attention ``attention`` asks for (CPU output)."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what the translator holds (nothing here)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def settings(self, decode: DecodeConfig | None = None, **overrides) -> DecodeConfig:
        """``decode`` (default: this translator's own settings, :attr:`decode`) with the named
        fields replaced, validated; a ConfigError names an unknown field."""
        unknown = set(overrides) - {f.name for f in fields(DecodeConfig)}
        if unknown:
            raise ConfigError(f"decode: unknown setting(s) {', '.join(sorted(unknown))}")
        return replace(decode or self.decode, **overrides)

    def translate(self, texts: Sequence[str], decode: DecodeConfig | None = None,
                  prefix: Sequence[str] | None = None, constraints: Sequence[Sequence[str]] | None = None,
                  markup: bool = False, **overrides) -> list[str]:
        """Translate each text with ``decode`` (default: :attr:`decode`) and ``overrides`` of its
        fields (``beam=1`` is greedy search). Empty input gives empty output. ``prefix``: one
        target text per input that its translation must begin with ("" for none).
        ``constraints``: per input, target phrases its translation must contain (constrained
        beam search, :mod:`~transduce.inference.search.constraints`). ``markup``: tags and
        placeholders are taken out before translation and put back at aligned positions
        (:mod:`~transduce.inference.text.markup`)."""
        decode = self.settings(decode, **overrides)
        if decode.rerank == "none":  # only the best is needed; reranking chooses among the n-best
            decode = replace(decode, nbest=1)
        if markup:
            return translate_markup(self, texts, decode, prefix, constraints)
        out = self.translate_detailed(texts, decode, prefix=prefix, constraints=constraints, scores=False)
        return [t.best.text for t in out]

    def translate_detailed(self, texts: Sequence[str], decode: DecodeConfig | None = None,
                           attention: AttentionChoice | None = None, prefix: Sequence[str] | None = None,
                           constraints: Sequence[Sequence[str]] | None = None, alignment: bool = False,
                           scores: bool = True, **overrides) -> list[Translation]:
        """Translate with beam search (greedy when ``beam == 1``), keeping ``nbest`` hypotheses;
        ``attention`` also returns each hypothesis' cross-attention of that layer and head;
        ``prefix``: each output begins with that target text (the rest is searched);
        ``constraints``: per text, target phrases its output must contain; ``alignment``: the
        best hypothesis' word alignment too (its ``alignment``, :mod:`~transduce.inference.text.alignment`);
        ``scores`` False: greedy search's hypotheses get score 0 (it skips the softmax over the
        vocabulary each step; :meth:`translate` asks for none). Beam search (and so reranking)
        and sampling score anyway."""
        decode = self.settings(decode, **overrides)
        if attention is not None:
            check_layer_head(self.config, attention.layer, attention.head)
        if decode.rerank == "mbr" and decode.mbr_samples:
            if prefix is not None or constraints is not None or attention is not None:
                raise ConfigError("decode.mbr_samples: MBR over samples takes no prefix, constraints or attention")
            results = self._sampled_mbr(texts, decode)
        else:
            results = self._run(texts, SearchSpec(decode, attention, scores=scores), prefix, constraints)
        if alignment:
            add_alignments(self, results, decode)
        return results

    def _sampled_mbr(self, texts: Sequence[str], decode: DecodeConfig) -> list[Translation]:
        """MBR over ``decode.mbr_samples`` samples of each text (seeds 0, 1, ...)."""
        plain = replace(decode, rerank="none", nbest=1)
        draws = [self._run(texts, SearchSpec(plain, temperature=1.0, seed=k)) for k in range(decode.mbr_samples)]
        for first, *others in zip(*draws):
            if first.source_tokens:
                first.hypotheses = [t.best for t in (first, *others)]
                mbr_rerank(first, decode.mbr_utility, samples=True)
        return draws[0]

    def sample(self, texts: Sequence[str], temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
               seed: int | None = None, decode: DecodeConfig | None = None, **overrides) -> list[Translation]:
        """One sampled translation per text (see :func:`~transduce.inference.search.sampling.sample`);
        ``decode`` gives the length limits and batch size."""
        check_sampling(temperature, top_k, top_p)
        decode = self.settings(decode, **overrides)
        spec = SearchSpec(decode, temperature=float(temperature), top_k=top_k, top_p=float(top_p), seed=seed)
        return self._run(texts, spec)

    def score(self, sources: Sequence[str], targets: Sequence[str], decode: DecodeConfig | None = None,
              **overrides) -> list:
        """Score each target as the translation of its source (forced decoding): a list of
        :class:`~transduce.inference.scoring.Scored` (log-probability, the score beam search would
        give that output, per-piece log-probabilities), in order."""
        with torch.inference_mode():
            return score_pairs(self, sources, targets, self.settings(decode, **overrides))

    def encode_source(self, text: str, max_input_len: int | None = None) -> tuple[list[int], bool]:
        """Source ids (no EOS), cut to ``max_input_len`` (default: :attr:`decode`'s, capped by
        what learned positions can represent); returns (ids, truncated)."""
        limit = input_limit(self.config, self.decode.max_input_len if max_input_len is None else max_input_len)
        ids = self.tokenizer.encode(text, side="src")
        if len(ids) <= limit:
            return ids, False
        logger.warning("input of %d tokens truncated to max_input_len=%d: %.40r...", len(ids), limit, text)
        return ids[:limit], True

    def _run(self, texts: Sequence[str], spec: SearchSpec, prefix: Sequence[str] | None = None,
             constraints: Sequence[Sequence[str]] | None = None) -> list[Translation]:
        """Tokenize, search in length-sorted batches, and return results in input order."""
        for name, given in (("prefix", prefix), ("constraints", constraints)):
            if given is not None and len(given) != len(texts):
                raise ConfigError(f"{name}: {len(given)} given for {len(texts)} texts (one per text)")
        tagged, lead, forced = source_texts(texts, spec.decode, self.tokenizer)  # (language codes: lead, forced)
        with scope(DATA):
            results = [self._source(t, s, spec.decode.max_input_len, lead) for t, s in zip(texts, tagged)]
            todo = [i for i, r in enumerate(results) if r.source_tokens]
            eos = self.config.eos_id
            lengths = [len(results[i].source_tokens) + 1 for i in todo]
            batches = [[todo[j] for j in batch] for batch in self._batches(lengths, spec.decode.batch_tokens)]
            sources = [pad([results[i].source_tokens + [eos] for i in index], self.config.pad_id)  # (B, S) each
                       for index in batches]
        prefixes = None
        if prefix is not None or forced:
            ids = [self.tokenizer.encode(p, side="tgt") if p else [] for p in prefix or [""] * len(texts)]
            prefixes = [prefix_ids([forced + ids[i] for i in index]) for index in batches]
        phrases = None
        if constraints is not None:
            ids = [[self.tokenizer.encode(p, side="tgt") for p in c if p.strip()] for c in constraints]
            phrases = [constraint_ids([ids[i] for i in index]) for index in batches]
        inside = None if phrases is None else self.word_pieces
        for index, out in zip(batches, self._search(sources, spec, prefixes, phrases, inside)):
            rows = out.rows()
            for row, i in enumerate(index):
                results[i].hypotheses = self._hypotheses(rows[row], out, row, len(results[i].source_tokens) + 1,
                                                         len(forced))
            logger.debug("translated a batch of %d sentences", len(index))
            if self.progress is not None:
                self.progress.update(len(index))
        if spec.decode.rerank == "mbr":
            for r in results:
                mbr_rerank(r, spec.decode.mbr_utility)
        elif spec.decode.rerank == "reverse":
            reverse_rerank(results, self.reverse, spec.decode)
        return results

    def _source(self, text: str, tagged: str, max_input_len: int, lead: list[int]) -> Translation:
        """``text`` read as the model reads it: ``tagged``, after the ``lead`` ids (a language code)."""
        ids, truncated = self.encode_source(tagged, max_input_len - len(lead))  # the model's input; source: the text
        ids = lead + ids if ids else ids
        pieces = self.tokenizer.pieces(ids, side="src")
        empty = [Hypothesis("", [], [], 0.0, 0.0)] if not ids else []
        return Translation(text, ids, pieces, empty, truncated)

    def _hypotheses(self, row_lists: tuple[list, list, list, list], out: SearchOutput, row: int,
                    src_len: int, skip: int = 0) -> list[Hypothesis]:
        """Hypothesis objects of batch row ``row`` (``row_lists``: its tokens, lengths, scores
        and log-probs as lists, :meth:`SearchOutput.rows`), skipping empty (-inf) slots; the
        first ``skip`` tokens (a forced language code) are the model's, not the translation's."""
        hyps = []
        eos = self.config.eos_id
        for k, (tokens, length, score, log_prob) in enumerate(zip(*row_lists)):
            if score == float("-inf") and hyps:
                continue
            ids = tokens[:length]
            ended = bool(ids) and ids[-1] == eos
            content = (ids[:-1] if ended else ids)[skip:]
            attention = None
            if out.attention is not None:
                attention = out.attention[row, k, skip: len(ids), :src_len].float()
            hyps.append(Hypothesis(self.tokenizer.decode(content, side="tgt"),
                                   content, self.tokenizer.pieces(content, side="tgt"),
                                   score, log_prob, ended, attention))
        return hyps


def input_limit(config, max_input_len: int) -> int:
    """``max_input_len``, capped by what learned positions can represent."""
    cap = config.max_positions - 1 if getattr(config, "positions", None) == "learned" else max_input_len
    return min(max_input_len, cap)
