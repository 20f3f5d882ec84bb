"""The rules of a config made of dataclass sections, shared by the bundled trainer's config
(:mod:`.config`) and fine-tuning's (:mod:`mlxops.finetune.config`), key for key.

A config is a dataclass with one field per section (``train``, ``model``, ...: each a
dataclass of typed keys) and ``out``. Values reach it from a mapping (the config file, a
job's section) or from ``--set section.key=value`` strings; either way a key is
``section.key`` (or ``out``), an unknown one is refused, and the value is coerced to the
key's type by the config's own ``coerce(where, key, type, value)``. A ``--set`` value is
JSON when it parses, else the text; where the key is a string the text is kept as typed
(``007`` stays ``"007"``). Every refusal is a :class:`ConfigError` naming where the value
came from and the key (exit 2); an unknown key names the key meant, where one is close or
was renamed (:mod:`.vocabulary`).

The world size's rule (:func:`check_world_size`) and the resume rule
(:func:`diff_keys`) are the same for both configs too. Standard library only.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, get_type_hints

from . import balance as balance_rule
from .configfile import ConfigError, read_file
from .vocabulary import known_keys, unknown_key

Coerce = Callable[[str, str, Any, Any], Any]


def parse_scalar(text: str) -> Any:
    """A command-line value: JSON if it parses (numbers, true, null, "..."), else a string."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def set_key(cfg: Any, sections: Mapping[str, type], where: str, key: str, value: Any,
            coerce: Coerce, text: str | None = None) -> None:
    """Set ``section.key`` (or ``out``) of ``cfg``; ``text``: the command line's spelling."""
    if key == "out":
        cfg.out = coerce(where, key, str, value if text is None else text)
        return
    section_name, _, sub = key.partition(".")
    if section_name not in sections:
        raise unknown_key(where, key, known_keys(sections))
    hints = get_type_hints(type(getattr(cfg, section_name)))
    if sub not in hints:
        raise unknown_key(where, key, known_keys(sections))
    if text is not None and hints[sub] in (str, str | None) and value is not None:
        value = text  # keep "007" or "1e3" as strings where a string is expected
    setattr(getattr(cfg, section_name), sub, coerce(where, key, hints[sub], value))


def fill(cfg: Any, sections: Mapping[str, type], data: Mapping[str, Any], where: str,
         coerce: Coerce) -> None:
    """Set every key of a nested mapping (``{section: {key: value}}``, ``out``)."""
    for key, value in data.items():
        if key == "out":
            set_key(cfg, sections, where, key, value, coerce)
            continue
        if key not in sections:
            if isinstance(value, dict) and value:  # name its first key: optimizer.lr
                key = f"{key}.{next(iter(value))}"
            raise unknown_key(where, key, known_keys(sections) + list(sections))
        if value is None:
            continue
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: {key}: must be a mapping")
        for sub, v in value.items():
            set_key(cfg, sections, where, f"{key}.{sub}", v, coerce)


def override(cfg: Any, sections: Mapping[str, type], items: Iterable[str], where: str,
             coerce: Coerce) -> None:
    """Apply ``section.key=value`` strings (the ``--set`` option)."""
    for item in items:
        key, sep, text = item.partition("=")
        if not sep:
            raise ConfigError(f"{where}: {item}: expected section.key=value")
        set_key(cfg, sections, where, key, parse_scalar(text), coerce, text)


def read_source(source: str | os.PathLike[str] | dict[str, Any], where: str | None,
                default: str) -> tuple[dict[str, Any], str]:
    """A config's mapping and the name its messages give it: a mapping as it is
    (``where``, else ``default``), or a file's (``where``, else its path)."""
    if isinstance(source, dict):
        return source, where or default
    path = Path(source)
    return read_file(path), where or str(path)


def check_world_size(global_batch: int, balance: str | list[float], world: int, where: str,
                     unit: str) -> None:
    """The rules that need the number of ranks: every rank takes at least one ``unit`` of
    each global batch, ``balance: equal`` needs a global batch that divides, and a list of
    weights has one per rank."""
    if world < 1:
        raise ConfigError(f"{where}: the world size must be at least 1, got {world}")
    if isinstance(balance, list) and len(balance) != world:
        raise ConfigError(f"{where}: train.balance: {len(balance)} weights for {world} ranks "
                          "(one weight per rank)")
    if balance == balance_rule.EQUAL and global_batch % world:
        raise ConfigError(f"{where}: train.global_batch: {global_batch} is not divisible by "
                          f"the world size {world} (each rank takes global_batch / world "
                          f"{unit}s)")
    if global_batch < world:
        raise ConfigError(f"{where}: train.global_batch: {global_batch} is smaller than the "
                          f"world size {world} (every rank takes at least one {unit})")


def diff_keys(keys: Iterable[str], saved: Mapping[str, Any], now: Mapping[str, Any],
              defaults: Mapping[str, Any]) -> list[str]:
    """``["section.key: checkpoint has A, config has B"]`` for each of ``keys`` whose saved
    value differs from ``now``'s; a key the checkpoint lacks (newer than it) had its
    default (``defaults``) then. All three: ``{section: {key: value}}``."""
    out = []
    for key in keys:
        section, sub = key.split(".")
        a = saved.get(section, {}).get(sub, defaults[section][sub])
        b = now[section][sub]
        if a != b:
            out.append(f"{key}: checkpoint has {a!r}, config has {b!r}")
    return out
