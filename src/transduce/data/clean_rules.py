"""The per-pair cleaning rules, and the hashes the duplicate rules compare (:mod:`transduce.data.clean`).

Each rule looks at one pair alone, so a chunk of pairs is judged anywhere (a worker process);
the duplicate rules need every earlier pair and run in order in :mod:`transduce.data.dedup`.
:func:`judge_chunk` gives each pair the name of the first rule it fails, or None, and its
duplicate keys. Written for speed (about 10 us a pair without language identification): the
common case leaves each check early (an ASCII side has no debris, no other script).
"""

from __future__ import annotations

import hashlib
import re
import zlib
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from transduce.config.clean import LANGUAGE_SCRIPT, MAX_TOKEN_CHARS, MAX_WORDS, SCRIPT_MIN, CleanConfig
from transduce.errors import require

# Rule names in the order they are checked (the duplicate ones last, in order, in the main process).
RULES = ("empty", "debris", "long_token", "too_long", "ratio", "copy", "script", "numbers", "punctuation", "lang",
         "duplicate", "near_duplicate")

_DEBRIS = re.compile(r"</?[A-Za-z][A-Za-z0-9]*(?:\s[^<>]*)?/?>|&(?:[A-Za-z]{2,8}|#\d{2,6}|#x[0-9A-Fa-f]{2,5});"
                     r"|[\ufffd\x00-\x08\x0b-\x1f\x7f-\x9f]|Ã[\x80-\xbf©¤¶¼½¾]|â€")
_ASCII_DEBRIS = re.compile(r"</?[A-Za-z][A-Za-z0-9]*(?:\s[^<>]*)?/?>|&(?:[A-Za-z]{2,8}|#\d{2,6}|#x[0-9A-Fa-f]{2,5});"
                           r"|[\x00-\x08\x0b-\x1f\x7f]")
_MARKS = re.compile(r"\d+|[?!()\[\]]")  # what must match across sides: numbers, some punctuation
_NOT_WORD = re.compile(r"[\W_]+")
_LETTER = re.compile(r"[^\W\d_]")
_SCRIPT_LETTERS = {
    "Latin": r"A-Za-z\u00aa\u00b5\u00ba\u00c0-\u024f\u1e00-\u1eff", "Cyrillic": r"\u0400-\u052f",
    "Greek": r"\u0370-\u03ff\u1f00-\u1fff", "Hebrew": r"\u0590-\u05ff", "Arabic": r"\u0600-\u06ff\u0750-\u077f",
    "Devanagari": r"\u0900-\u097f", "Bengali": r"\u0980-\u09ff", "Gurmukhi": r"\u0a00-\u0a7f",
    "Gujarati": r"\u0a80-\u0aff", "Oriya": r"\u0b00-\u0b7f", "Tamil": r"\u0b80-\u0bff", "Telugu": r"\u0c00-\u0c7f",
    "Kannada": r"\u0c80-\u0cff", "Malayalam": r"\u0d00-\u0d7f", "Sinhala": r"\u0d80-\u0dff",
    "Thai": r"\u0e00-\u0e7f", "Lao": r"\u0e80-\u0eff", "Tibetan": r"\u0f00-\u0fff", "Myanmar": r"\u1000-\u109f",
    "Georgian": r"\u10a0-\u10ff", "Ethiopic": r"\u1200-\u139f", "Khmer": r"\u1780-\u17ff",
    "Armenian": r"\u0530-\u058f", "Han": r"\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff",
    "Hangul": r"\u1100-\u11ff\u3130-\u318f\uac00-\ud7af",
    "Japanese": r"\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uff66-\uff9f",
}
_MASK64 = (1 << 64) - 1
_IDENTIFIERS: dict[tuple, object] = {}  # one py3langid model per process and candidate set


@dataclass(frozen=True)
class Judge:
    """What the rules need besides a pair: the settings and the two declared languages."""

    cfg: CleanConfig
    src_lang: str
    tgt_lang: str

    def script_res(self) -> tuple:
        """Per side, a pattern of the letters outside the declared language's script (None: no check)."""
        out = []
        for lang in (self.src_lang, self.tgt_lang):
            script = LANGUAGE_SCRIPT.get(lang, "")
            out.append(re.compile(f"[^\\W\\d_{_SCRIPT_LETTERS[script]}]") if script else None)
        return tuple(out)

    def long_token_re(self) -> re.Pattern | None:
        n = MAX_TOKEN_CHARS
        return re.compile(f"\\S{{{n + 1},}}") if self.cfg.on("long_token") else None


def normalise(text: str) -> str:
    """Lowercase, every run of punctuation, symbols and spaces one space: what duplicates compare."""
    return _NOT_WORD.sub(" ", text.lower()).strip()


def rule_of(src: str, tgt: str, norms: tuple[str, str], judge: Judge, res: tuple) -> str | None:
    """The first rule (of :data:`RULES` before ``lang``) that ``(src, tgt)`` fails, or None.

    ``norms``: the sides :func:`normalise`d; ``res``: ``(judge.script_res(), judge.long_token_re())``.
    """
    cfg, both = judge.cfg, f"{src}\t{tgt}"
    if not norms[0] or not norms[1]:
        return "empty" if not src.strip() or not tgt.strip() else _marks_only(src, tgt, cfg)
    plain = both.isascii()
    if cfg.on("debris") and (_ASCII_DEBRIS if plain else _DEBRIS).search(both):
        return "debris"
    if res[1] is not None and res[1].search(both):
        return "long_token"
    ns, nt = len(src.split()), len(tgt.split())
    if cfg.on("too_long") and max(ns, nt) > MAX_WORDS:
        return "too_long"
    if cfg.on("ratio") and (_bad_ratio(ns, nt, cfg.max_ratio) or _bad_ratio(len(src), len(tgt), cfg.max_char_ratio)):
        return "ratio"
    if cfg.on("copy") and _copied(*norms, cfg.copy_overlap):
        return "copy"
    if cfg.on("script") and not plain and any(pattern is not None and _off_script(side, pattern, SCRIPT_MIN)
                                        for side, pattern in zip((src, tgt), res[0])):
        return "script"
    marks = _MARKS.findall(src), _MARKS.findall(tgt)
    return _mark_rule(*marks, cfg) if (marks[0] or marks[1]) and _differ(*marks) else None


def _mark_rule(a: list[str], b: list[str], cfg: CleanConfig) -> str | None:
    """``numbers`` if the digit sequences of the sides differ, ``punctuation`` if their ``?!()[]`` do."""
    da, db = [m for m in a if m[0].isdigit()], [m for m in b if m[0].isdigit()]
    if cfg.on("numbers") and _differ(da, db):
        return "numbers"
    pa, pb = [m for m in a if not m[0].isdigit()], [m for m in b if not m[0].isdigit()]
    return "punctuation" if cfg.on("punctuation") and _differ(pa, pb) else None


def _marks_only(src: str, tgt: str, cfg: CleanConfig) -> str | None:
    """A side of punctuation or symbols alone ("...", "-"): a copy if both are, else debris."""
    if cfg.on("copy") and src.strip() == tgt.strip():
        return "copy"
    return "debris" if cfg.on("debris") else None


def _differ(a: list[str], b: list[str]) -> bool:
    return len(a) != len(b) or (a != b and sorted(a) != sorted(b))


def _bad_ratio(a: int, b: int, limit: float) -> bool:
    return limit > 0 and max(a, b) > limit * min(a, b)


def _copied(s: str, t: str, overlap: float) -> bool:
    if s == t or (min(len(s), len(t)) >= 10 and (s in t or t in s)):  # a short side may be inside by chance
        return True
    a, b = set(s.split()), set(t.split())
    return len(a & b) > overlap * len(a | b)


def _off_script(text: str, pattern: re.Pattern, least: float) -> bool:
    if not pattern.search(text):  # the usual case: every letter in the script
        return False
    letters = len(_LETTER.findall(text))
    return letters > 0 and len(pattern.findall(text)) > (1 - least) * letters


# ---- language identification -----------------------------------------------------------------

def identifier(candidates: Sequence[str]):
    """This process's py3langid model over ``candidates`` (empty: every language it knows)."""
    key = tuple(sorted(candidates))
    if key not in _IDENTIFIERS:
        langid = require("py3langid.langid", "clean", "the lang rule (data.clean.lang)")
        model = langid.LanguageIdentifier.from_model_file(langid.MODEL_FILE)
        if key:
            model.set_languages(list(key))
        _IDENTIFIERS[key] = model
    return _IDENTIFIERS[key]


def lang_candidates(judge: Judge) -> tuple[str, ...]:
    """The languages identification chooses among: the setting plus the declared pair (empty: all)."""
    listed = judge.cfg.lang_candidates
    return tuple(sorted({*listed, judge.src_lang, judge.tgt_lang})) if listed else ()


# ---- duplicate keys --------------------------------------------------------------------------

def pair_key(norm_src: str, norm_tgt: str) -> int:
    """A 64-bit hash of a normalised pair (never 0: the hash tables' empty slot)."""
    digest = hashlib.blake2b(f"{norm_src}\t{norm_tgt}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") or 1


def minhash_params(cfg: CleanConfig) -> tuple[np.ndarray, np.ndarray]:
    """The bands x rows permutations ``(a * x + b) mod 2^32`` (a odd) of 32-bit word hashes, seeded:
    the same keys in every run and process."""
    rng = np.random.default_rng(58)
    k = cfg.minhash_bands * cfg.minhash_rows
    a = rng.integers(0, 2**31, size=k, dtype=np.uint32) * np.uint32(2) + np.uint32(1)
    return a, rng.integers(0, 2**32, size=k, dtype=np.uint32)


def band_keys(norms: Sequence[tuple[str, str]], cfg: CleanConfig) -> np.ndarray:
    """Each normalised pair's LSH band keys: a MinHash signature of its set of words (the target's
    marked apart from the source's), cut into bands, each band hashed to 64 bits.

    Shape: (N, bands), uint64, never 0.
    """
    words = [{*s.split(), *(f"\x01{w}" for w in t.split())} or {""} for s, t in norms]
    counts = np.fromiter(map(len, words), np.int64, len(words))
    shingles = np.fromiter((zlib.crc32(w.encode()) for ws in words for w in ws), np.uint32, int(counts.sum()))
    a, b = minhash_params(cfg)
    values = shingles[:, None] * a + b  # (shingles, k), mod 2^32
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    sig = np.minimum.reduceat(values, starts, axis=0).astype(np.uint64)  # (N, k)
    sig = sig.reshape(len(norms), cfg.minhash_bands, cfg.minhash_rows)
    mix = np.uint64(0x9E3779B97F4A7C15)
    keys = np.zeros(sig.shape[:2], np.uint64)
    for r in range(cfg.minhash_rows):  # a multiply-xorshift hash of each band's rows
        keys = (keys ^ sig[:, :, r]) * mix
        keys ^= keys >> np.uint64(29)
    keys = (keys + np.arange(1, cfg.minhash_bands + 1, dtype=np.uint64)) * mix  # band i's keys its own
    keys[keys == 0] = 1
    return keys


# ---- a chunk -----------------------------------------------------------------------------------

def judge_chunk(pairs: Sequence[tuple[str, str]], judge: Judge) -> tuple[list, np.ndarray, np.ndarray]:
    """Per pair, the first per-pair rule it fails (None: none), and the duplicate keys of all.

    Returns:
        ``(rules, keys, bands)``: ``keys`` (N,) the normalised pairs' hashes, ``bands`` (N, bands)
        their LSH band keys ((N, 0) when ``near_duplicate`` is off).
    """
    cfg, res = judge.cfg, (judge.script_res(), judge.long_token_re())
    norms = [(normalise(s), normalise(t)) for s, t in pairs]
    rules = [rule_of(s, t, n, judge, res) for (s, t), n in zip(pairs, norms)]
    if cfg.on("lang"):
        model = identifier(lang_candidates(judge))
        classify = model.classify
        for i, (s, t) in enumerate(pairs):
            if rules[i] is None and (classify(s)[0] != judge.src_lang or classify(t)[0] != judge.tgt_lang):
                rules[i] = "lang"
    keys = np.fromiter((pair_key(s, t) for s, t in norms), np.uint64, len(norms)) if cfg.on("duplicate") else \
        np.zeros(len(pairs), np.uint64)
    bands = band_keys(norms, cfg) if cfg.on("near_duplicate") and pairs else np.zeros((len(pairs), 0), np.uint64)
    return rules, keys, bands
