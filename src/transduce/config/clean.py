"""``data.clean``: which corpus-cleaning rules run and how they are tuned (:mod:`transduce.data.clean`).

``transduce clean`` reads the same section, and ``prepare``/``train`` run it on the training
split when it is set (``data.clean: {}`` runs every rule with its default).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .base import check, from_dict, positive, typecheck

if TYPE_CHECKING:
    from .data import DataConfig

# The language codes the cleaner knows: py3langid's 97 (the identifier of the `clean` extra), each
# with the script its letters are written in ("" where it is mixed or several: no script check).
_SCRIPTS = {
    "Cyrillic": "ba be bg kk ky mk mn ru sr tg tt uk",
    "Greek": "el grc", "Hebrew": "he hbo", "Arabic": "ar ary arz fa ps sdh ug ur",
    "Devanagari": "gom hi mr ne sa", "Bengali": "as bn", "Gurmukhi": "pa", "Gujarati": "gu", "Oriya": "or",
    "Tamil": "ta", "Telugu": "te", "Kannada": "kn", "Malayalam": "ml", "Sinhala": "si", "Thai": "th",
    "Lao": "lo", "Khmer": "km", "Myanmar": "my", "Georgian": "ka", "Armenian": "hy", "Ethiopic": "am",
    "Tibetan": "dz", "Han": "wuu yue zh", "Hangul": "ko", "Japanese": "ja",
    "Latin": "ace af an az bcl br bs ca crh cs cy da de en eo es et eu ext fi fo fr fuv fy ga gcf gcr gd gl "
             "gug guw ha hr ht hu id ig is it jv kab kik la lb lg lij ln lt ltg lv mg ms mt nl nn no nso oc om "
             "pcm pl pt qu ro rw se sk sl sn so sq st sv sw tk tl tr uz vec vi vo wa xh yo zu",
    "": "ku uzs zxx",
}
LANGUAGE_SCRIPT = {code: script for script, codes in _SCRIPTS.items() for code in codes.split()}


@dataclass(frozen=True)
class CleanConfig:
    """The cleaning rules, each switchable, in the order they are checked; a pair is dropped by
    the first rule it fails (``removed.jsonl`` names it)."""

    debris: bool = True
    """``debris``: HTML tags or entities, U+FFFD, control characters or mojibake (``Ã©``, ``â€``)."""
    max_token_chars: int = 50
    """``long_token``: a whitespace token of more characters (a URL, base64, glued words); 0: off."""
    max_words: int = 250
    """``too_long``: a side of more whitespace-separated words; 0: off."""
    max_ratio: float = 3.0
    """``ratio``: the longer side has more than this many times the words of the shorter..."""
    max_char_ratio: float = 2.0
    """... or more than this many times its characters (a truncated side); 0: off."""
    copy: bool = True
    """``copy``: the target is the source (or the source is inside the target, or the reverse)
    after normalisation, or the sides' word sets overlap more than ``copy_overlap``."""
    copy_overlap: float = 0.6
    """Jaccard overlap of the sides' lowercased word sets above which they are near-identical."""
    script: bool = True
    """``script``: fewer than ``script_min`` of a side's letters are in its language's script."""
    script_min: float = 0.5
    """The least share of a side's letters in the declared language's script."""
    numbers: bool = True
    """``numbers``: the digit sequences of the two sides differ (as multisets)."""
    punctuation: bool = True
    """``punctuation``: the sides' counts of ``?``, ``!``, ``(``, ``)``, ``[``, ``]`` differ."""
    lang: bool = True
    """``lang``: language identification (py3langid, the ``clean`` extra) of either side says
    another language than the declared one (``data.src_lang``, ``data.tgt_lang``)."""
    lang_candidates: tuple = ()
    """The languages the identifier chooses among (each side's declared one is added); empty:
    all 97 it knows. Fewer is faster and more accurate, but a side in a language left out is
    then named as the nearest one listed."""
    duplicate: bool = True
    """``duplicate``: the pair equals an earlier one after normalisation (lowercase, punctuation
    and spacing removed), by a 64-bit hash."""
    near_duplicate: bool = False
    """``near_duplicate``: MinHash LSH (Broder, 1997) over the pair's word set: shares a band with an
    earlier pair (Jaccard similarity around (1/bands)^(1/rows) and above)."""
    minhash_bands: int = 4
    """LSH bands."""
    minhash_rows: int = 8
    """MinHash values per band (bands x rows hash functions)."""
    dedup_memory_mb: int = 256
    """Memory of the duplicate state, fixed whatever the corpus size: two hash tables of 8-byte
    keys, each at most half full; when one fills, the older is forgotten. Every pair is checked
    against at least the last (MB x 2^20 / 32 / keys-per-pair) pairs, a key per pair for
    ``duplicate`` and one per band for ``near_duplicate``."""

    def __post_init__(self) -> None:
        if isinstance(self.lang_candidates, list):
            object.__setattr__(self, "lang_candidates", tuple(self.lang_candidates))
        typecheck(self, "data.clean")
        positive(self, "data.clean", ("minhash_bands", "minhash_rows", "dedup_memory_mb"))
        for key in ("max_token_chars", "max_words", "max_char_ratio"):
            check(getattr(self, key) >= 0, f"data.clean.{key}", f"must be >= 0 (0: off); got {getattr(self, key)}")
        check(self.max_ratio == 0 or self.max_ratio >= 1, "data.clean.max_ratio", f"must be >= 1 or 0 (off); "
              f"got {self.max_ratio}")
        check(self.max_char_ratio == 0 or self.max_char_ratio >= 1, "data.clean.max_char_ratio",
              f"must be >= 1 or 0 (off); got {self.max_char_ratio}")
        for key in ("copy_overlap", "script_min"):
            check(0 < getattr(self, key) <= 1, f"data.clean.{key}", f"must be in (0, 1]; got {getattr(self, key)}")
        for code in self.lang_candidates:
            check_language(code, "data.clean.lang_candidates")

    @property
    def threshold(self) -> float:
        """The Jaccard similarity at which a pair is a near-duplicate with probability about 1/2."""
        return (1 / self.minhash_bands) ** (1 / self.minhash_rows)


def check_language(code: Any, key: str) -> None:
    """A ConfigError naming ``key`` unless ``code`` is a language code the cleaner knows."""
    check(isinstance(code, str) and code in LANGUAGE_SCRIPT, key,
          f"unknown language code {code!r} (the cleaner knows ISO 639-1 codes such as en, de, fr, cs; "
          "see transduce.config.clean.LANGUAGE_SCRIPT)")


def clean_settings(values: Any) -> CleanConfig:
    """``data.clean`` as a checked :class:`CleanConfig` (None or ``{}``: every default)."""
    return from_dict(CleanConfig, dict(values or {}), "data.clean")


def normalise_clean(cfg: "DataConfig") -> dict[str, Any]:
    """``cfg.clean`` with every key filled in (the form saved with a run and a prepared manifest),
    or a ConfigError naming the key."""
    check(cfg.pairs is None and cfg.corpus != "tsv", "data.clean", "applies to one language pair's parallel text "
          "(not data.pairs or data.corpus=tsv)")
    check(cfg.train_alignments is None, "data.clean", "does not apply with data.train_alignments (a dropped "
          "pair would leave its links behind: clean the corpus and its alignments first)")
    check(isinstance(cfg.clean, dict), "data.clean", f"expected a mapping of rule settings; got {cfg.clean!r}")
    settings = clean_settings(cfg.clean)
    check_language(cfg.src_lang, "data.src_lang")
    check_language(cfg.tgt_lang, "data.tgt_lang")
    out = dataclasses.asdict(settings)
    out["lang_candidates"] = list(settings.lang_candidates)
    return out
