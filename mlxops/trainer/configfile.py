"""The trainer's config file reader: JSON, or YAML when PyYAML happens to be importable.

The reader is the trainer's own (the controller's, ``mlxops.yamlfile``, is not synced to
nodes) with the same rules and wording: a key written twice is refused, ``FILE: KEY:
duplicate key``, where JSON and PyYAML would silently keep the last one. What the values
mean, and which are valid, is :mod:`.config`'s business.

Standard library only (PyYAML when present).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """An invalid config: a one-line message naming the file and the key. Exit code 2."""

    exit_code = 2


class _Pairs(list):
    """A JSON object as its (key, value) pairs in file order, so duplicates can be seen."""


def _unique_keys(value: Any, path: Path, key: str | None = None) -> Any:
    """JSON data with its objects made dicts; a key twice in one object is refused."""
    if isinstance(value, _Pairs):
        out: dict[str, Any] = {}
        for name, item in value:
            where = f"{key}.{name}" if key else name
            if name in out:
                raise ConfigError(f"{path}: {where}: duplicate key")
            out[name] = _unique_keys(item, path, where)
        return out
    if isinstance(value, list):
        return [_unique_keys(item, path, f"{key or ''}[{i}]") for i, item in enumerate(value)]
    return value


def _read_json(text: str, path: Path) -> Any:
    try:
        data = json.loads(text, object_pairs_hook=_Pairs)
    except ValueError as e:
        raise ConfigError(f"{path}: invalid JSON: {e}") from None
    return _unique_keys(data, path)


def _read_yaml(text: str, path: Path) -> Any:
    try:
        import yaml  # optional: nodes may not have PyYAML; mlxops writes JSON
    except ImportError:
        raise ConfigError(f"{path}: YAML needs PyYAML; use a JSON config") from None
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _refuse_duplicate_keys(yaml, loader, node, path, None)
        return loader.construct_document(node)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{path}: {where}invalid YAML: {problem}") from None
    finally:
        loader.dispose()


def _refuse_duplicate_keys(yaml: Any, loader: Any, node: Any, path: Path, key: str | None
                           ) -> None:
    """Keys written twice in one mapping, over the node tree as written. Merge keys
    (``<<: *base``) are not duplicates: the mapping's own keys override merged ones."""
    if isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _refuse_duplicate_keys(yaml, loader, item, path, f"{key or ''}[{i}]")
    elif isinstance(node, yaml.MappingNode):
        first: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            name = loader.construct_object(key_node, deep=True)
            where = f"{key}.{name}" if key else str(name)
            if not isinstance(name, (str, int, float, bool)):
                continue  # an unhashable key: construction reports it
            if name in first:
                raise ConfigError(f"{path}: {where}: duplicate key at line "
                                  f"{key_node.start_mark.line + 1} (first at line "
                                  f"{first[name].start_mark.line + 1})")
            first[name] = key_node
            _refuse_duplicate_keys(yaml, loader, value_node, path, where)


def read_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from None
    if path.suffix in (".yml", ".yaml"):
        data = _read_yaml(text, path)
    else:
        data = _read_json(text, path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the config must be a mapping")
    return data
