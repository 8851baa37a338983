"""``data.pairs``, a multilingual model's language pairs: read and checked (one-line ConfigErrors)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from .base import check

if TYPE_CHECKING:
    from .data import DataConfig

CORPORA = ("multi30k", "multi30k_tok")
MULTI30K_LANGS = ("en", "de", "fr", "cs")  # Multi30k task 1's languages (transduce.data.multi30k)


def normalise_pairs(cfg: "DataConfig") -> list[dict[str, Any]]:
    """``cfg.pairs`` as ``[{"src", "tgt", "weight"}]`` (weight None when not given), or a
    ConfigError naming the first bad entry."""
    key = "data.pairs"
    check(cfg.corpus in CORPORA, key, f"needs data.corpus {' or '.join(CORPORA)}; got {cfg.corpus}")
    check(isinstance(cfg.pairs, list) and len(cfg.pairs) >= 1, key, "must list at least one pair")
    check(not cfg.reverse, "data.reverse", "does not apply with data.pairs (list the pairs the other way)")
    check(cfg.tokenizer is None, "data.tokenizer", "does not apply with data.pairs (the joint tokenizer reserves "
          "the language tags)")
    check(cfg.joint_vocab, "data.joint_vocab", "must be true with data.pairs (one vocabulary holds every language)")
    out = [_pair(item, f"{key}[{i}]") for i, item in enumerate(cfg.pairs)]
    names = [f"{p['src']}-{p['tgt']}" for p in out]
    check(len(set(names)) == len(names), key, f"lists a pair twice: {', '.join(names)}")
    tgts = [p["tgt"] for p in out]
    check(len(set(tgts)) == len(tgts), key, f"each target language once (its tag <2xx> names the pair); got "
          f"{', '.join(names)}")
    given = [p["weight"] is not None for p in out]
    check(all(given) or not any(given), key, "give a weight to every pair or to none (then data.pair_temperature "
          "decides)")
    return out


def _pair(item: Any, key: str) -> dict[str, Any]:
    if isinstance(item, str):
        src, dash, tgt = item.partition("-")
        check(bool(dash), key, f"expected SRC-TGT (e.g. en-de) or {{src, tgt, weight}}; got {item!r}")
        item = {"src": src, "tgt": tgt}
    check(isinstance(item, dict), key, f"expected SRC-TGT or a mapping {{src, tgt, weight}}; got {item!r}")
    unknown = sorted(map(str, set(item) - {"src", "tgt", "weight"}))
    check(not unknown, key, f"unknown key(s) {', '.join(unknown)}")
    for side in ("src", "tgt"):
        lang = item.get(side)
        check(isinstance(lang, str) and lang in MULTI30K_LANGS, f"{key}.{side}",
              f"unknown language {lang!r}; Multi30k has {', '.join(MULTI30K_LANGS)}")
    check(item["src"] != item["tgt"], key, f"source and target are both {item['src']}")
    weight = item.get("weight")
    if weight is not None:
        ok = isinstance(weight, (int, float)) and not isinstance(weight, bool) and math.isfinite(weight) and weight > 0
        check(ok, f"{key}.weight", f"must be a number > 0; got {weight!r}")
        weight = float(weight)
    return {"src": item["src"], "tgt": item["tgt"], "weight": weight}
