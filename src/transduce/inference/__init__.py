"""Decoding. The front doors live here, at the top; the work they share in rooms below them.

Front doors (each loads a model and takes text): :func:`load` (:mod:`.runtime`) for every way in,
with :mod:`.placement` (which directories, which device, threads, backend);
:class:`Translator` (:mod:`.translator`, in this process) and :class:`TranslatorPool`
(:mod:`.pool`, in worker processes, :mod:`.workers`), both on :mod:`.translation`'s text side and
:mod:`.decode_batches`; :class:`Generator` (:mod:`.generate`) for decoder-only language models;
:class:`Classifier` (:mod:`.classify`); and what calls a translator: :mod:`.files` (``transduce
translate``), :mod:`.documents`, :mod:`.streaming`, :mod:`.scoring` (``transduce score``),
:mod:`.quantize` (``transduce quantize``).

Rooms: :mod:`.search` (the algorithms on id tensors, n-best reranking, the vocabulary shortlist;
one dispatcher), :mod:`.speed` (the decode-time speed layer), :mod:`.backends` (exported graphs
run in the model's place), :mod:`.text` (markup, word alignments, terms: the text around the
search) and :mod:`.analysis` (attention maps and attention health, for people)."""

from .analysis.attention_maps import AttentionMaps, attention_maps
from .analysis.attention_stats import (AttentionStats, HeadStats, HealthLimits, attention_stats,
                                       attention_stats_files, format_attention_stats)
from .decode_batches import length_sorted_batches, spread_batches
from .classify import Classifier
from .files import translate_file
from ..config import GenerationConfig
from .generate import Generator
from .pool import SearchPool, TranslatorPool
from .runtime import Runtime, load
from .search import (AttentionChoice, DraftStats, SearchOutput, SearchSpec, Speculation, beam_search,
                     greedy_search, length_penalty, max_lengths, sample, speculative_search)
from .speed import prepare_for_decoding, restore
from .translator import BaseTranslator, Hypothesis, Translation, Translator, draft_summary

__all__ = [
    "Runtime", "load", "Classifier", "draft_summary",
    "greedy_search", "beam_search", "sample", "speculative_search", "Speculation", "DraftStats",
    "SearchOutput", "length_penalty", "max_lengths",
    "length_sorted_batches", "spread_batches", "Translator", "BaseTranslator", "TranslatorPool", "SearchPool",
    "SearchSpec", "Translation", "Hypothesis", "translate_file",
    "Generator", "GenerationConfig",
    "AttentionMaps", "attention_maps", "AttentionChoice",
    "AttentionStats", "HeadStats", "HealthLimits", "attention_stats", "attention_stats_files", "format_attention_stats",
    "prepare_for_decoding", "restore",
]
