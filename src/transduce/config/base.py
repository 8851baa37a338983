"""What every config section shares: one-line checks, the one builder, YAML in and out, overrides.

A bad value raises :class:`~transduce.errors.ConfigError` whose one-line message starts with the
key it names (``model.d_model: ...``). The helpers here are for the config modules; the
package exports :func:`from_dict`, :func:`apply_overrides`, :func:`read_yaml` and :func:`save_yaml`.
"""

from __future__ import annotations

import os
import re
from dataclasses import fields
from pathlib import Path
from typing import Any, Iterable, get_args, get_origin, get_type_hints

import yaml

from ..atomic import atomic_write_text
from ..errors import ConfigError, one_line
from .legacy import migrate, migrate_overrides, migrate_section

# Numbers such as 3e-4 or 1E5, which YAML 1.1 (PyYAML) reads as strings for want of a dot.
_YAML_FLOAT_AS_STR = re.compile(r"[-+]?[0-9]+[eE][-+]?[0-9]+")


def check(cond: bool, key: str, msg: str) -> None:
    """Raise ``ConfigError("key: msg")`` unless ``cond``."""
    if not cond:
        raise ConfigError(f"{key}: {msg}")


def one_of(value: Any, key: str, choices: tuple) -> None:
    """``key`` must be one of ``choices``."""
    check(value in choices, key, f"must be one of {', '.join(map(str, choices))}; got {value!r}")


def positive(obj: Any, section: str, keys: Iterable[str]) -> None:
    """Each of ``obj``'s fields ``keys`` must be > 0 (None passes: an optional field left unset)."""
    for k in keys:
        v = getattr(obj, k)
        check(v is None or v > 0, f"{section}.{k}", f"must be positive; got {v}")


def non_negative(obj: Any, section: str, keys: Iterable[str]) -> None:
    """Each of ``obj``'s fields ``keys`` must be >= 0."""
    for k in keys:
        v = getattr(obj, k)
        check(v >= 0, f"{section}.{k}", f"must be >= 0; got {v}")


def typecheck(obj: Any, section: str) -> None:
    """Check each field's value against its annotation (int, float, bool, str, tuple, Optional).

    An int where a float is expected becomes that float, and so does a string YAML 1.1 read from
    a number like ``3e-4``.
    """
    hints = get_type_hints(type(obj))
    for f in fields(obj):
        value, tp = getattr(obj, f.name), hints[f.name]
        key = f"{section}.{f.name}"
        allowed = tuple(get_args(tp)) if get_origin(tp) is not None else (tp,)
        if value is None:
            check(type(None) in allowed, key, "must not be empty")
            continue
        if float in allowed and isinstance(value, int) and not isinstance(value, bool):
            object.__setattr__(obj, f.name, float(value))
            continue
        if float in allowed and isinstance(value, str) and _YAML_FLOAT_AS_STR.fullmatch(value.strip()):
            object.__setattr__(obj, f.name, float(value))  # YAML 1.1 reads "3e-4" (no dot) as a string
            continue
        ok = any(isinstance(value, a) and not (a is int and isinstance(value, bool))
                 for a in allowed if isinstance(a, type))
        names = "/".join(a.__name__ for a in allowed if a is not type(None))
        check(ok, key, f"must be {names}; got {value!r}")


def from_dict(klass: type, values: Any, section: str) -> Any:
    """Build one section's dataclass from a mapping: unknown keys and values of the wrong type are
    a ConfigError naming ``section`` (and ``section.key``); the class checks the rest."""
    values = migrate_section(section, values)  # an older config's keys under today's names
    if not isinstance(values, dict):
        raise ConfigError(f"{section}: expected a mapping, got {type(values).__name__}")
    unknown = set(values) - {f.name for f in fields(klass)}
    # A key that is not a plain word (spaces, a newline, not a string) is shown quoted: one line.
    names = sorted(k if isinstance(k, str) and k.isidentifier() else repr(k) for k in unknown)
    check(not unknown, section, f"unknown key(s) {', '.join(names)}")
    return klass(**values)


def apply_overrides(d: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Apply ``section.key=value`` strings to a config dict (values parsed as YAML scalars); a key
    in a nested section has one more dot (``model.attention.kind=local``). An older config's keys,
    in ``d`` or in the overrides, are read under today's names (:mod:`~transduce.config.legacy`)."""
    d = {k: _copied(v) for k, v in migrate(d).items()}
    for item in migrate_overrides(overrides):
        key, sep, raw = item.partition("=")
        section, dot, name = key.strip().partition(".")
        check(bool(sep and dot and name), "override", f"expected section.key=value, got {item!r}")
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError:
            value = raw
        *parents, leaf = name.split(".")
        target = d.setdefault(section, {})
        for parent in parents:
            check(isinstance(target, dict), key, "section is not a mapping")
            target = target.setdefault(parent, {})
        check(isinstance(target, dict), key, "section is not a mapping")
        target[leaf] = value
    return d


def _copied(value: Any) -> Any:
    """Mappings copied all the way down (an override must not change the caller's dict)."""
    return {k: _copied(v) for k, v in value.items()} if isinstance(value, dict) else value


def read_yaml(path: str | os.PathLike) -> dict[str, Any]:
    """A YAML file's mapping ({} for an empty file); ConfigError if missing or not YAML."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: config file not found")
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ConfigError(f"{p}: not valid YAML ({one_line(e)})") from None
    if data is not None and not isinstance(data, dict):  # found by a property test: "1" was an AttributeError
        raise ConfigError(f"{p}: expected a mapping of sections (model, data, train, decode), "
                          f"got {type(data).__name__}")
    return data or {}


def save_yaml(data: dict[str, Any], path: str | os.PathLike) -> None:
    """Write YAML atomically (temporary file in the same directory, then rename)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(p, yaml.dump(data, Dumper=_Dumper, sort_keys=False))


class _Dumper(yaml.SafeDumper):
    """Safe YAML with tuples (``train.betas``, ``model.labels``) written as lists."""


_Dumper.add_representer(tuple, lambda dumper, value: dumper.represent_list(value))
