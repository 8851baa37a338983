"""Multilingual training: several language pairs in one model (``data.pairs``).

As fairseq, OpenNMT and Marian do (Johnson et al., 2017), each source sentence begins with a tag
naming the language to translate into, ``<2de>``: a user-defined piece of the joint vocabulary
(always one token, never split), reserved when the tokenizer is trained on every side of every
pair. The training split is the pairs' sentences one pair after another; each epoch draws from
them by pair (:func:`sampling_probs`, :func:`epoch_indices`): with ``weight`` p_i is proportional
to w_i, else to n_i^(1/T) (``data.pair_temperature``; Arivazhagan et al., 2019), n_i the pair's
training sentences. An epoch has as many draws as the split has sentences; a pair drawn more
often than it has sentences repeats them. The draws are a function of seed and epoch, so an
exact resume continues them. A sentence's pair is read off its first source token, its tag.

An imported NLLB-200 or M2M-100 model names its languages otherwise, with language codes
(``fra_Latn``, ``__fr__``: control pieces, ``Tokenizer.lang_codes``): the code of the source's
language (``decode.src_lang``) begins each source, and the code of ``decode.tgt_lang`` is forced
as the first output token (:func:`code_ids`, :func:`source_texts`).
"""

from __future__ import annotations

import difflib
import logging
from typing import Any, Collection, Sequence

import numpy as np

from transduce.data import multi30k
from transduce.data.alignments import WORD_START
from transduce.errors import ConfigError

logger = logging.getLogger(__name__)
TaggedPair = tuple[str, str]


def lang_tag(lang: str) -> str:
    """The tag of target language ``lang``: ``<2de>``."""
    return f"<2{lang}>"


def pair_name(pair: dict[str, Any]) -> str:
    """``en-de``: how validation names a pair (``val_bleu/en-de``)."""
    return f"{pair['src']}-{pair['tgt']}"


def target_langs(pairs: Sequence[dict[str, Any]]) -> list[str]:
    """The target languages of ``pairs``, in order of first mention (one tag each)."""
    return list(dict.fromkeys(p["tgt"] for p in pairs))


def tagged(text: str, lang: str) -> str:
    """``text`` with the tag of ``lang`` in front."""
    return f"{lang_tag(lang)} {text}"


def with_tag(texts: Sequence[str], tgt_lang: str | None, tags: dict[str, int]) -> list[str]:
    """The inputs of a model trained with target-language ``tags`` (lang -> id): each text tagged
    with ``tgt_lang``, but a text that begins with a known tag already keeps it alone (a tag naming
    another language than ``tgt_lang`` is an error naming the text); without ``tgt_lang`` each text
    must begin with a known tag. A model without tags takes the texts as they are (and no
    ``tgt_lang``). ConfigError, one line, otherwise."""
    known = ", ".join(sorted(tags))
    if not tags:
        if tgt_lang is not None:
            raise ConfigError(f"decode.tgt_lang: {tgt_lang!r} given, but this model was not trained with "
                              "target-language tags (data.pairs)")
        return list(texts)
    own = {lang_tag(k): k for k in tags}
    if tgt_lang is None:
        if all(text.split(" ", 1)[0] in own for text in texts):
            return list(texts)
        raise ConfigError(f"decode.tgt_lang: this model translates into {known}: say which (--tgt-lang)")
    if tgt_lang not in tags:
        raise ConfigError(f"decode.tgt_lang: unknown target language {tgt_lang!r}; this model knows {known}")
    out = []
    for text in texts:
        lang = own.get(text.split(" ", 1)[0])
        if lang is not None and lang != tgt_lang:  # the line quoted: a file is read in chunks
            raise ConfigError(f"decode.tgt_lang: is {tgt_lang!r}, but this line is tagged for {lang!r}: "
                              f"{text[:60]!r}")
        out.append(text if lang is not None else tagged(text, tgt_lang))
    return out


def code_ids(codes: dict[str, int], src_lang: str | None, tgt_lang: str | None) -> tuple[list[int], list[int]]:
    """A model with language ``codes`` (lang -> id; an imported NLLB or M2M-100): the ids each
    source begins with (``src_lang``'s code) and each output (``tgt_lang``'s, forced); a model
    without codes: none, and ``src_lang`` must be None. ConfigError, one line, for a missing or
    unknown language (the closest codes named)."""
    if not codes:
        if src_lang is not None:
            raise ConfigError(f"decode.src_lang: {src_lang!r} given, but this model's inputs name no source "
                              "language (an imported NLLB or M2M-100 model's do)")
        return [], []
    return [_code_id(codes, src_lang, "src_lang")], [_code_id(codes, tgt_lang, "tgt_lang")]


def _code_id(codes: dict[str, int], lang: str | None, key: str) -> int:
    """The id of ``lang``'s code; a one-line ConfigError for ``decode.{key}`` naming close codes."""
    if lang in codes:
        return codes[lang]
    some = ", ".join(sorted(codes)[:5]) + (", ..." if len(codes) > 5 else "")
    if lang is None:
        raise ConfigError(f"decode.{key}: this model translates between {len(codes)} languages ({some}): say "
                          f"which (--{key.replace('_', '-')})")
    close = ([c for c in sorted(codes) if c.lower().startswith(lang.lower())]  # fra -> fra_Latn
             or difflib.get_close_matches(lang, list(codes), n=5, cutoff=0.5))[:5]
    raise ConfigError(f"decode.{key}: unknown language code {lang!r}; "
                      + (f"did you mean {', '.join(close)}?" if close else f"this model knows {some}")
                      + f" ({len(codes)} codes)")


def source_texts(texts: Sequence[str], decode, tokenizer) -> tuple[list[str], list[int], list[int]]:
    """What the model reads for ``texts`` under ``decode``'s languages: the texts (tagged with
    ``decode.tgt_lang`` for a model with target-language tags, :func:`with_tag`), and the ids
    each source begins with and each output is forced to begin with (a model with language
    codes, :func:`code_ids`; else none)."""
    codes = getattr(tokenizer, "lang_codes", {})
    lead, forced = code_ids(codes, decode.src_lang, decode.tgt_lang)
    return (list(texts) if codes else with_tag(texts, decode.tgt_lang, getattr(tokenizer, "lang_tags", {})),
            lead, forced)


def tag_length(tokens: Sequence[int], pieces: Sequence[str], tag_ids: Collection[int]) -> int:
    """How many leading source tokens are a target-language tag (``tag_ids``), with the lone ``▁``
    SentencePiece may put before it: 0, 1 or 2. They are the model's input but no word of the
    user's text (word alignments skip them)."""
    if tokens[:1] and tokens[0] in tag_ids:
        return 1
    return 2 if len(tokens) > 1 and pieces[0] == WORD_START and tokens[1] in tag_ids else 0


def pair_texts(read, pairs: Sequence[dict[str, Any]], interleave: bool = False) -> list[TaggedPair]:
    """Every pair's sentences, each source tagged with its target language: one pair after another,
    or ``interleave``d (a line of each pair in turn while all have lines, then the rest: the first
    lines of a validation split, ``data.valid_max_sentences``, are then of every pair alike);
    ``read(src, tgt)`` gives a pair's (source, target) lines."""
    each = [[(tagged(s, p["tgt"]), t) for s, t in read(p["src"], p["tgt"])] for p in pairs]
    if not interleave:
        return [line for lines in each for line in lines]
    n = min(map(len, each))
    return [lines[i] for i in range(n) for lines in each] + [line for lines in each for line in lines[n:]]


def reserved_tags(cfg) -> list[str]:
    """The tags a ``data.pairs`` config's tokenizer reserves (none for another config)."""
    return [lang_tag(lang) for lang in target_langs(cfg.pairs or ())]


def split_texts(cfg) -> dict[str, tuple[tuple[str, str], list[TaggedPair], tuple]]:
    """The train/valid/test splits of ``data.pairs`` on Multi30k, each as (its two sides' names,
    its tagged text pairs, the files read): in memory (Multi30k is small), line counts checked."""
    root = multi30k.root_of(cfg.root)
    tok = cfg.corpus == "multi30k_tok"
    out = {}
    for name, split in zip(("train", "valid", "test"), ("train", "val", "test_2016_flickr")):
        texts = pair_texts(lambda s, t: multi30k.read_split(root, split, s, t, tokenized=tok), cfg.pairs,
                           interleave=name != "train")
        label = f"Multi30k {split} ({', '.join(map(pair_name, cfg.pairs))})"
        find = multi30k.tok_files if tok else multi30k.multi30k_files
        files = tuple(dict.fromkeys(f for p in cfg.pairs for f in find(root, split, p["src"], p["tgt"])))
        out[name] = ((f"{label} source", f"{label} target"), texts, files)
    return out


# ---- sampling --------------------------------------------------------------------------------

def sampling_probs(sizes: Sequence[int], weights: Sequence[float | None], temperature: float) -> np.ndarray:
    """Each pair's probability: proportional to its weight when weights are given, else to
    ``size ** (1 / temperature)``. A pair with no sentence gets none."""
    sizes = np.asarray(sizes, dtype=np.float64)
    if weights and weights[0] is not None:
        raw = np.asarray(weights, dtype=np.float64)
    else:
        raw = sizes ** (1.0 / temperature)
    raw = np.where(sizes > 0, raw, 0.0)
    if raw.sum() <= 0:
        raise ConfigError("data.pairs: no pair has a training sentence left")
    return raw / raw.sum()


def epoch_indices(pair_ids: np.ndarray, probs: np.ndarray, seed: int, epoch: int) -> np.ndarray:
    """The training sentences of ``epoch``, drawn by pair: as many as there are sentences, pair i
    ``round(p_i * n)`` of them (largest remainders), its sentences in a fresh random order, again
    and again as needed; a function of (seed, epoch)."""
    n = len(pair_ids)
    rng = np.random.default_rng([seed, epoch, 0x6D756C74])  # "mult": a stream of its own
    counts = _apportion(probs, n)
    out = []
    for i, count in enumerate(counts):
        members = np.flatnonzero(pair_ids == i)
        if count == 0 or members.size == 0:
            continue
        rounds = -(-count // members.size)
        out.append(np.concatenate([rng.permutation(members) for _ in range(rounds)])[:count])
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def _apportion(probs: np.ndarray, n: int) -> np.ndarray:
    """Integer counts summing to ``n`` closest to ``probs * n`` (the largest remainders get the rest)."""
    exact = probs * n
    counts = np.floor(exact).astype(np.int64)
    rest = n - int(counts.sum())
    counts[np.argsort(-(exact - counts), kind="stable")[:rest]] += 1
    return counts


def pair_ids(heads: np.ndarray, tag_ids: Sequence[int]) -> np.ndarray:
    """Each sentence's pair (index into ``tag_ids``, the pairs' target tags) from its first two
    source tokens ``heads`` (N, 2): the tag, which SentencePiece may precede by a lone ``▁``; -1
    where neither is a pair's tag."""
    out = np.full(len(heads), -1, dtype=np.int64)
    for i, tag in enumerate(tag_ids):
        out[(heads == tag).any(axis=1) & (out < 0)] = i
    return out


class PairDraws:
    """Which language pair each training sentence is of, and each pair's probability: the draws
    of every epoch (:func:`epoch_indices`)."""

    def __init__(self, ids: np.ndarray, probs: np.ndarray, names: Sequence[str]):
        self.ids, self.probs, self.names = ids, probs, list(names)

    @classmethod
    def of(cls, cfg, pairs, tokenizer) -> "PairDraws":
        """The draws of ``cfg.pairs`` (a DataConfig's) over the prepared training ``pairs``."""
        tags = tokenizer.lang_tags
        missing = [p["tgt"] for p in cfg.pairs if p["tgt"] not in tags]
        if missing:
            raise ConfigError(f"data.pairs: the tokenizer has no tag for {', '.join(missing)} (prepared for "
                              "other pairs?)")
        starts, tokens = np.asarray(pairs.offsets[:-1, 0]), pairs.tokens[0]
        second = np.minimum(starts + 1, max(len(tokens) - 1, 0))
        heads = np.stack([tokens[starts], tokens[second]], axis=1)
        ids = pair_ids(heads, [tags[p["tgt"]] for p in cfg.pairs])
        sizes = np.bincount(ids[ids >= 0], minlength=len(cfg.pairs))
        probs = sampling_probs(sizes, [p["weight"] for p in cfg.pairs], cfg.pair_temperature)
        names = [pair_name(p) for p in cfg.pairs]
        logger.info("language pairs: %s", ", ".join(f"{n} {k:,} sentences p={q:.3f}"
                                                     for n, k, q in zip(names, sizes, probs)))
        return cls(ids, probs, names)

    def epoch(self, seed: int, epoch: int) -> np.ndarray:
        """The training sentences of ``epoch`` (indices), by pair."""
        return epoch_indices(self.ids, self.probs, seed, epoch)
