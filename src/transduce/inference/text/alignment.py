"""Word alignments of translations from cross-attention (``i-j``: source word i, target word j).

The chosen output is force-decoded once with the attention weights on (``need_weights``, the
explicit softmax path: exact, and independent of which search produced it), and each target
subword is linked to the source subword its cross-attention weighs most (layer
``decode.alignment_layer``, head ``decode.alignment_head`` or the mean over heads), as fairseq's
``extract_hard_alignment`` and Marian's ``--alignment hard`` do; the EOS column and row take no
part. Subword links become word links through SentencePiece's ``▁`` word starts: words are
numbered from 0 on each side, in the order of the detokenized text's whitespace-separated words.
A multilingual model's target-language tag (``<2de>``) is no source word: its columns take no part.

Legend: B pairs, S source length (EOS counted), T target length (EOS counted).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from ...config import DecodeConfig
from ...data.alignments import WORD_START, Alignment, parse_links, word_index  # noqa: F401 (re-exported)
from ...data.multilingual import code_ids, lang_tag, tag_length
from ...errors import ConfigError
from ..scoring import forced_batches
from ..search.common import AttentionChoice
from .markup import restore_markup, strip_markup


def hard_alignment(attention: Tensor, src_pieces: Sequence[str], tgt_pieces: Sequence[str]) -> Alignment:
    """Word links from a (T, S) cross-attention map: each target piece (rows, EOS row ignored)
    to its source piece of highest weight (columns, EOS column ignored), mapped to words; sorted
    (source word, target word) pairs without repeats.

    Shape: attention (T', S') with T' >= len(tgt_pieces), S' >= len(src_pieces); extra rows and
    columns (EOS, padding) are ignored.
    """
    if not src_pieces or not tgt_pieces:
        return []
    src_words, tgt_words = word_index(src_pieces), word_index(tgt_pieces)
    best = attention[: len(tgt_pieces), : len(src_pieces)].float().argmax(dim=1).tolist()  # (T,)
    return sorted({(src_words[i], tgt_words[j]) for j, i in enumerate(best)})


def format_alignment(links: Alignment) -> str:
    """Pharaoh format: ``"0-0 1-2 2-1"``."""
    return " ".join(f"{i}-{j}" for i, j in links)


def parse_alignment(line: str, where: str = "alignment") -> Alignment:
    """The links of a Pharaoh-format line (``i-j`` pairs separated by spaces; empty: none); a
    one-line ConfigError naming ``where`` for anything else."""
    return parse_links(line, where, ConfigError)


def alignment_choice(config, decode: DecodeConfig) -> AttentionChoice:
    """The layer and head ``decode`` asks alignments from, checked against the model ``config``;
    the default layer -2 is the last of a one-layer decoder."""
    n = config.n_decoder_layers
    layer = decode.alignment_layer
    if layer == -2 and n == 1:
        layer = -1
    if not -n <= layer < n:
        raise ConfigError(f"decode.alignment_layer: must be in [{-n}, {n}) for the {n}-layer decoder; got {layer}")
    if decode.alignment_head is not None and not 0 <= decode.alignment_head < config.n_heads:
        raise ConfigError(f"decode.alignment_head: must be in [0, {config.n_heads}); got {decode.alignment_head}")
    return AttentionChoice(layer, decode.alignment_head)


def forced_details(translator, results: Sequence, decode: DecodeConfig, alignment: bool
                   ) -> tuple[list[list[float]], list[Alignment | None]]:
    """For each translation's best hypothesis, by one forced decoding under ``decode``: each
    token's log-probability (EOS last when it ended; [] for an empty source) and, with
    ``alignment``, its word alignment (None without)."""
    eos, tok = translator.config.eos_id, translator.tokenizer
    codes = getattr(tok, "lang_codes", {})  # (an imported NLLB model's: the source's first, the target's forced)
    tag_ids = set(getattr(tok, "lang_tags", {}).values()) | set(codes.values())
    first = code_ids(codes, decode.src_lang, decode.tgt_lang)[1]  # (scored, not the translation's)
    lead = len(first)
    choice = alignment_choice(translator.config, decode) if alignment else None
    todo = [i for i, r in enumerate(results) if r.source_tokens and (r.best.tokens or r.best.ended)]
    src_ids = [results[i].source_tokens + [eos] for i in todo]
    tgt_ids = [first + results[i].best.tokens + [eos] * results[i].best.ended for i in todo]
    log_probs: list[list[float]] = [[] for _ in results]
    links: list[Alignment | None] = [[] if alignment else None for _ in results]
    with torch.inference_mode():
        for index, forced in forced_batches(translator, src_ids, tgt_ids, decode, choice):
            for row, j in enumerate(index):
                r = results[todo[j]]
                log_probs[todo[j]] = forced.token_log_probs[row, lead: len(tgt_ids[j])].tolist()
                if alignment:  # the words of the user's text: a multilingual model's tag is none of them
                    skip = tag_length(r.source_tokens, r.source_pieces, tag_ids)
                    links[todo[j]] = hard_alignment(forced.cross_attention[row][lead:, skip:], r.source_pieces[skip:],
                                                    r.best.pieces)
    return log_probs, links


def add_alignments(translator, results: Sequence, decode: DecodeConfig) -> None:
    """Set each translation's best hypothesis' ``alignment`` (word links; [] for an empty line)."""
    _, links = forced_details(translator, results, decode, alignment=True)
    for r, a in zip(results, links):
        r.best.alignment = a


def translate_markup(translator, texts: Sequence[str], decode: DecodeConfig, prefix: Sequence[str] | None = None,
                     constraints: Sequence[Sequence[str]] | None = None) -> list[str]:
    """Translate ``texts`` with their markup taken out, then put back at aligned positions
    (:mod:`~transduce.inference.text.markup`); a text without markup is translated as usual."""
    stripped = strip_sources(translator, texts)
    results = translator.translate_detailed([s.text for s in stripped], decode, prefix=prefix,
                                            constraints=constraints)
    marked = [n for n, s in enumerate(stripped) if s.elements]
    _, links = forced_details(translator, [results[n] for n in marked], decode, alignment=True)
    restore_all([results[n] for n in marked], [stripped[n] for n in marked], links)
    return [r.best.text for r in results]


def strip_sources(translator, texts: Sequence[str]) -> list:
    """Each text without its markup (:func:`~transduce.inference.text.markup.strip_markup`), a leading
    target-language tag of ``translator``'s model kept as its tag."""
    lead = {lang_tag(lang) for lang in getattr(translator.tokenizer, "lang_tags", {})}
    return [strip_markup(t, lead) for t in texts]


def restore_all(results: Sequence, stripped: Sequence, links: Sequence[Alignment]) -> None:
    """Put each :class:`~transduce.inference.text.markup.Stripped` markup back into its result's best
    translation (its ``text``), by the alignment ``links`` of that translation."""
    for r, s, a in zip(results, stripped, links):
        r.best.text = restore_markup(s, r.best.text, a)
