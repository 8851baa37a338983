"""Streaming a translation: its text handed out as the search decides it.

The search tells a :data:`~transduce.inference.search.common.StepHook` which tokens are settled
after each step (greedy and speculative search: every token chosen; beam search: the prefix all
hypotheses that may still win share); :func:`stream_translation` turns them into text deltas.
Joined, the deltas are the translation ``Translator.translate`` returns for the same settings.

Examples:
    >>> parts = []
    >>> stream_translation(translator, "A dog runs.", parts.append, beam=4)  # doctest: +SKIP
    'Ein Hund läuft.'
    >>> parts                                                               # doctest: +SKIP
    ['Ein', ' Hund', ' läuft.']
"""

from __future__ import annotations

from typing import Callable

from torch import Tensor

from ..config import DecodeConfig
from ..errors import ConfigError
from .translator import Translator


def stream_translation(translator: Translator, text: str, emit: Callable[[str], None],
                       decode: DecodeConfig | None = None, **overrides) -> str:
    """Translate ``text`` with ``decode`` (default: the translator's settings) and ``overrides``,
    calling ``emit(delta)`` from the searching thread each time more of the translation is
    settled; returns the translation (= the deltas joined).

    Only settled text is emitted, so nothing is taken back; when a detokenizer would rewrite text
    already emitted (a later token changing an earlier character), the rest waits for the end.
    Greedy, beam and speculative search stream (not sampling, reranking or worker processes).
    """
    if not isinstance(translator, Translator):
        raise ConfigError("stream: streaming runs the search in this process; load with runtime.workers=0")
    decode = translator.settings(decode, nbest=1, **overrides)
    if decode.rerank != "none" or decode.mbr_samples:
        raise ConfigError(f"decode.rerank: a streamed translation is the search's best; got rerank {decode.rerank}")
    shown = ""
    eos = translator.config.eos_id

    def on_step(ids: Tensor, tokens: Tensor, settled: Tensor) -> None:
        nonlocal shown
        ids_ = tokens[0, : int(settled[0])].tolist()  # one text: one batch of one row
        if ids_ and ids_[-1] == eos:
            ids_ = ids_[:-1]
        now = translator.tokenizer.decode(ids_, side="tgt").rstrip("\ufffd")  # a partial UTF-8 byte sequence
        if len(now) > len(shown) and now.startswith(shown):
            emit(now[len(shown):])
            shown = now

    translator.on_step = on_step
    try:
        result = translator.translate([text], decode)[0]
    finally:
        translator.on_step = None
    if result.startswith(shown) and len(result) > len(shown):
        emit(result[len(shown):])
    return result
