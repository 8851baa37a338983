"""Decoding: greedy search, beam search, sampling, speculative decoding with a draft model, and
the text-in text-out Translator (in this process, or TranslatorPool: in worker processes);
Generator for decoder-only language models."""

from .attention import AttentionMaps, attention_maps
from .batching import length_sorted_batches, spread_batches
from .beam import beam_search
from .files import translate_file
from ..config import GenerationConfig
from .generate import Generator
from .pool import SearchPool, TranslatorPool
from .sampling import sample
from .fast import prepare_for_decoding, restore
from .search import AttentionChoice, SearchOutput, greedy_search, length_penalty, max_lengths
from .speculative import DraftStats, Speculation, speculative_search
from .translator import BaseTranslator, Hypothesis, SearchSpec, Translation, Translator

__all__ = [
    "greedy_search", "beam_search", "sample", "speculative_search", "Speculation", "DraftStats",
    "SearchOutput", "length_penalty", "max_lengths",
    "length_sorted_batches", "spread_batches", "Translator", "BaseTranslator", "TranslatorPool", "SearchPool",
    "SearchSpec", "Translation", "Hypothesis", "translate_file",
    "Generator", "GenerationConfig",
    "AttentionMaps", "attention_maps", "AttentionChoice", "prepare_for_decoding", "restore",
]
