"""Configs written before the sections had structure (commit 683217a and earlier), read as today's.

The one migration: the keys a config section, a saved model directory's ``config.yaml``, a
prepared directory's manifest or a ``section.key=value`` override used to have are mapped to
today's, each with a one-line notice (a ``logging`` warning) that names the new key. A key is
renamed (:data:`RENAMED`: its value moves as it is) or folded (:data:`FOLDED`: a family of
switches became one field, or a setting nobody changed became a constant: its value is
rewritten into today's form, and a value today's form cannot say is a ConfigError naming the
key). A model directory's file is migrated in memory, after its checksum is verified; saving
writes the new form.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable

from ..errors import ConfigError

logger = logging.getLogger("transduce.config")

# (section, old key) -> today's key path in that section. model.attention as a string is the kind.
RENAMED: dict[tuple[str, str], str] = {
    ("model", "attention"): "attention.kind",
    ("model", "cross_attention"): "attention.cross",
    ("model", "attention_window"): "attention.window",
    ("model", "attention_windows"): "attention.windows",
    ("model", "global_tokens"): "attention.global_tokens",
    ("model", "global_projections"): "attention.global_projections",
    ("model", "linformer_k"): "attention.linformer_k",
    ("model", "attention_block"): "attention.block",
    ("model", "random_blocks"): "attention.random_blocks",
    ("model", "lsh_hashes"): "attention.lsh_hashes",
    ("model", "lsh_buckets"): "attention.lsh_buckets",
    ("model", "attention_seed"): "attention.seed",
    ("train", "num_threads"): "threads",
    ("data", "tokenizer_type"): "tokenizer_algorithm",
}

# Rules of data.clean that were a boolean each, now an entry of data.clean.rules (in this order).
CLEAN_RULES = ("debris", "long_token", "too_long", "ratio", "copy", "script", "numbers", "punctuation", "lang",
               "duplicate", "near_duplicate")
DEFAULT_CLEAN_RULES = CLEAN_RULES[:-1]  # near_duplicate is off by default


def _rule(name: str) -> Callable[[Any, dict], None]:
    """An old boolean switch of one rule: on or off in ``rules``."""
    def fold(value: Any, out: dict) -> None:
        if not isinstance(value, bool):
            raise ConfigError(f"data.clean.{name}: must be bool; got {value!r}")
        _set_rule(out, name, value)
    return fold


def _set_rule(out: dict, rule: str, on: bool) -> None:
    rules = set(out.get("rules", DEFAULT_CLEAN_RULES)) - {rule} | ({rule} if on else set())
    out["rules"] = [r for r in CLEAN_RULES if r in rules]


def _threshold(section: str, key: str, fixed: Any, rule: str | None) -> Callable[[Any, dict], None]:
    """A setting now fixed at ``fixed``: that value is dropped; 0 (where it meant off) turns ``rule``
    off; any other value cannot be said today (a ConfigError naming the key)."""
    def fold(value: Any, out: dict) -> None:
        if rule is not None and value == 0 and not isinstance(value, bool):
            _set_rule(out, rule, False)
        elif value != fixed or isinstance(value, bool):
            off = f", or 0 to turn the rule off: {section}.rules without {rule}" if rule else ""
            raise ConfigError(f"{section}.{key}: is fixed at {fixed} now (no config changed it); drop the key{off}; "
                              f"got {value!r}")
    return fold


def _serve_batching(value: Any, out: dict) -> None:
    if isinstance(value, bool):  # batching: true/false; continuous: true (below) makes it continuous
        out.setdefault("batching", "request" if value else "none")
    else:
        out["batching"] = value


def _serve_continuous(value: Any, out: dict) -> None:
    if value is True:
        out["batching"] = "continuous"


# (section, old key) -> (the new key the notice names, how the old value lands in today's mapping).
FOLDED: dict[tuple[str, str], tuple[str, Callable[[Any, dict], None]]] = {
    **{("data.clean", name): ("rules", _rule(name))
       for name in ("debris", "copy", "script", "numbers", "punctuation", "lang", "duplicate", "near_duplicate")},
    ("data.clean", "max_token_chars"): ("rules (long_token at 50 characters)",
                                        _threshold("data.clean", "max_token_chars", 50, "long_token")),
    ("data.clean", "max_words"): ("rules (too_long at 250 words)",
                                  _threshold("data.clean", "max_words", 250, "too_long")),
    ("data.clean", "script_min"): ("rules (script at a 0.5 share)",
                                   _threshold("data.clean", "script_min", 0.5, None)),
    ("data", "toy_seed"): ("the toy corpus's fixed seed 0", _threshold("data", "toy_seed", 0, None)),
    ("serve", "continuous"): ("batching (continuous)", _serve_continuous),
}

# A key renamed in place whose old value needs translating (serve.batching was a bool).
RETYPED: dict[tuple[str, str], tuple[str, Callable[[Any, dict], None]]] = {
    ("serve", "batching"): ("batching (none, request or continuous)", _serve_batching),
}

# A section held inside another's mapping: migrated with it (a prepared manifest's data.clean).
NESTED = {"data": "clean"}


def _is_old(section: str, key: str, value: Any) -> bool:
    # model.attention is today's key too: the old one is its string form (the kind); so is
    # serve.batching: the old one is a bool
    if (section, key) in RETYPED:
        return isinstance(value, bool)
    return ((section, key) in RENAMED and not (key == "attention" and isinstance(value, dict))) or \
        (section, key) in FOLDED


def new_name(section: str, key: str) -> str:
    """What the notice says ``section.key`` became."""
    if (section, key) in RENAMED:
        return f"{section}.{RENAMED[(section, key)]}"
    return f"{section}.{(FOLDED.get((section, key)) or RETYPED[(section, key)])[0]}"


_SAID: set[str] = set()  # the notices given: each once a process (a directory is read several times)


def _notice(section: str, keys: Iterable[str]) -> None:
    """One warning line naming each old key's new name."""
    names = ", ".join(f"{section}.{key} -> {new_name(section, key)}" for key in keys)
    line = f"an older config's keys, read under their new names: {names} (saving or editing the file updates it)"
    if line not in _SAID:
        _SAID.add(line)
        logger.warning(line)


def migrate_section(section: str, values: Any) -> Any:
    """``values`` (one section's mapping) with its old keys under today's names, a notice for each;
    anything that is not a mapping is returned as it is (the caller's check reports it)."""
    if not isinstance(values, dict):
        return values
    nested = NESTED.get(section)
    if nested is not None and isinstance(values.get(nested), dict):
        values = {**values, nested: migrate_section(f"{section}.{nested}", values[nested])}
    if not any(_is_old(section, k, v) for k, v in values.items()):
        return values
    out = {k: v for k, v in values.items() if not _is_old(section, k, v)}
    old = [key for key, value in values.items() if _is_old(section, key, value)]
    _notice(section, old)
    for key in old:
        value = values[key]
        if (section, key) not in RENAMED:
            (FOLDED.get((section, key)) or RETYPED[(section, key)])[1](value, out)
            continue
        parent, dot, leaf = RENAMED[(section, key)].rpartition(".")
        target = out
        if dot:
            if not isinstance(out.get(parent), (dict, type(None))):
                continue  # not a mapping: the section's check reports it
            target = out[parent] = dict(out.get(parent) or {})
        target.setdefault(leaf, value)  # a key given in the new form wins over the old one
    return out


def migrate(d: Any) -> Any:
    """A whole config mapping (``model``, ``data``, ``train``, ``decode``...) in today's form."""
    if not isinstance(d, dict):
        return d
    return {name: migrate_section(name, values) for name, values in d.items()}


def migrate_overrides(overrides: Iterable[str]) -> list[str]:
    """``section.key=value`` strings with old keys renamed (``model.attention_window=64`` ->
    ``model.attention.window=64``; ``model.attention=local`` -> ``model.attention.kind=local``); a
    folded key (``data.clean.lang=false``) is folded where its section is built, over the file's keys."""
    out = []
    for item in overrides:
        key, sep, raw = item.partition("=")
        section, dot, name = key.strip().partition(".")
        if sep and dot and (section, name) in RENAMED and not raw.lstrip().startswith("{"):
            _notice(section, [name])
            item = f"{section}.{RENAMED[(section, name)]}={raw}"
        out.append(item)
    return out
