"""``data.clean``: which corpus-cleaning rules run and how they are tuned (:mod:`transduce.data.clean`).

``rules`` lists the rules that run; the thresholds left are the ones worth tuning (the others are
the constants below).

``transduce clean`` reads the same section, and ``prepare``/``train`` run it on the training
split when it is set (``data.clean: {}`` runs every rule with its default).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .base import check, from_dict, positive, typecheck
from .legacy import CLEAN_RULES, DEFAULT_CLEAN_RULES

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


# The thresholds no config changed, fixed (each rule still switchable in ``rules``).
MAX_TOKEN_CHARS = 50  # long_token: a whitespace token of more characters (a URL, base64, glued words)
MAX_WORDS = 250  # too_long: a side of more whitespace-separated words
SCRIPT_MIN = 0.5  # script: the least share of a side's letters in the declared language's script


@dataclass(frozen=True)
class CleanConfig:
    """Which cleaning rules run (``rules``) and the thresholds worth tuning; a pair is dropped by
    the first rule it fails, in the order of :data:`CLEAN_RULES` (``removed.jsonl`` names it)."""

    rules: tuple = DEFAULT_CLEAN_RULES
    """The rules that run, any of :data:`CLEAN_RULES` (every one but ``near_duplicate`` by default),
    or changes to that default list: ``[-lang, +near_duplicate]``.

    - ``debris``: HTML tags or entities, U+FFFD, control characters or mojibake (``Ã©``, ``â€``).
    - ``long_token``: a whitespace token of more than 50 characters (a URL, base64, glued words).
    - ``too_long``: a side of more than 250 whitespace-separated words.
    - ``ratio``: the sides' lengths differ more than ``max_ratio`` (words) or ``max_char_ratio``
      (characters) times.
    - ``copy``: the target is the source (or the source is inside the target, or the reverse)
      after normalisation, or the sides' word sets overlap more than ``copy_overlap``.
    - ``script``: fewer than half of a side's letters are in its language's script.
    - ``numbers``: the digit sequences of the two sides differ (as multisets).
    - ``punctuation``: the sides' counts of ``?``, ``!``, ``(``, ``)``, ``[``, ``]`` differ.
    - ``lang``: language identification (py3langid, the ``clean`` extra) of either side says
      another language than the declared one (``data.src_lang``, ``data.tgt_lang``).
    - ``duplicate``: the pair equals an earlier one after normalisation (lowercase, punctuation
      and spacing removed), by a 64-bit hash.
    - ``near_duplicate``: MinHash LSH (Broder, 1997) over the pair's word set: shares a band with an
      earlier pair (Jaccard similarity around (1/bands)^(1/rows) and above).

    An older config's switches (``lang: false``, ``near_duplicate: true``, ``max_words: 0``) are
    read as this list (:mod:`~transduce.config.legacy`)."""
    max_ratio: float = 3.0
    """``ratio``: the longer side has more than this many times the words of the shorter (0: that
    comparison off)..."""
    max_char_ratio: float = 2.0
    """... or more than this many times its characters (a truncated side); 0: that comparison off."""
    copy_overlap: float = 0.6
    """``copy``: Jaccard overlap of the sides' lowercased word sets above which they are near-identical."""
    lang_candidates: tuple = ()
    """``lang``: the languages the identifier chooses among (each side's declared one is added);
    empty: all 97 it knows. Fewer is faster and more accurate, but a side in a language left out
    is then named as the nearest one listed."""
    minhash_bands: int = 4
    """``near_duplicate``: LSH bands."""
    minhash_rows: int = 8
    """``near_duplicate``: MinHash values per band (bands x rows hash functions)."""
    dedup_memory_mb: int = 256
    """Memory of the duplicate state, fixed whatever the corpus size: two hash tables of 8-byte
    keys, each at most half full; when one fills, the older is forgotten. Every pair is checked
    against at least the last (MB x 2^20 / 32 / keys-per-pair) pairs, a key per pair for
    ``duplicate`` and one per band for ``near_duplicate``."""

    def __post_init__(self) -> None:
        for key in ("rules", "lang_candidates"):
            if isinstance(getattr(self, key), list):
                object.__setattr__(self, key, tuple(getattr(self, key)))
        typecheck(self, "data.clean")
        object.__setattr__(self, "rules", _rules(self.rules))
        positive(self, "data.clean", ("minhash_bands", "minhash_rows", "dedup_memory_mb"))
        check(self.max_ratio == 0 or self.max_ratio >= 1, "data.clean.max_ratio", f"must be >= 1 or 0 (off); "
              f"got {self.max_ratio}")
        check(self.max_char_ratio == 0 or self.max_char_ratio >= 1, "data.clean.max_char_ratio",
              f"must be >= 1 or 0 (off); got {self.max_char_ratio}")
        check(0 < self.copy_overlap <= 1, "data.clean.copy_overlap", f"must be in (0, 1]; got {self.copy_overlap}")
        for code in self.lang_candidates:
            check_language(code, "data.clean.lang_candidates")

    def on(self, rule: str) -> bool:
        """Whether ``rule`` (one of :data:`CLEAN_RULES`) runs."""
        return rule in self.rules

    @property
    def threshold(self) -> float:
        """The Jaccard similarity at which a pair is a near-duplicate with probability about 1/2."""
        return (1 / self.minhash_bands) ** (1 / self.minhash_rows)


def _rules(rules: tuple) -> tuple:
    """``data.clean.rules`` in :data:`CLEAN_RULES`' order: the names given, or the default list with
    each ``+name`` added and each ``-name`` removed."""
    names = [r[1:] if isinstance(r, str) and r[:1] in "+-" else r for r in rules]
    for name in names:
        check(name in CLEAN_RULES, "data.clean.rules", f"unknown rule {name!r}; known: {', '.join(CLEAN_RULES)}")
    edits = [isinstance(r, str) and r[:1] in "+-" and r != "" for r in rules]
    check(all(edits) or not any(edits), "data.clean.rules", "either name the rules that run or change the "
          f"default list with +name/-name entries, not both; got {list(rules)}")
    chosen = set(names)
    if rules and all(edits):
        chosen = set(DEFAULT_CLEAN_RULES) | {r[1:] for r in rules if r[0] == "+"}
        chosen -= {r[1:] for r in rules if r[0] == "-"}
    return tuple(r for r in CLEAN_RULES if r in chosen)


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
    out["rules"], out["lang_candidates"] = list(settings.rules), list(settings.lang_candidates)
    return out
