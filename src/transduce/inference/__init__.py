"""Decoding: the front doors (:class:`Translator`, in this process, or :class:`TranslatorPool`,
in worker processes; :class:`Generator` for decoder-only language models; :class:`Classifier`),
the search algorithms (:mod:`.search`), the decode-time speed layer (:mod:`.speed`) and I/O."""

from .attention import AttentionMaps, attention_maps
from .attention_stats import (AttentionStats, HeadStats, HealthLimits, attention_stats, attention_stats_files,
                              format_attention_stats)
from .batching import length_sorted_batches, spread_batches
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
