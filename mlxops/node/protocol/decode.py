"""One decoder for every record that crosses a process or a host: JSON in, dataclass out.

Standard library only (synced to nodes). A record is a dataclass deriving :class:`Record`;
its field annotations are its schema, and :func:`decode` reads a parsed JSON value into it
by these rules, the same for every record:

* a dataclass wants a JSON object: a field without a default must be there, a field with
  one may be absent, and a key the record does not know is left out (a newer writer may say
  more);
* ``X | None`` takes null or an X; ``A | B`` takes the first arm that accepts the value;
* ``list[X]`` wants an array, ``dict[K, V]`` an object whose keys, strings in JSON, are read
  as K (``int`` reads ``"3"`` as 3, so ``int | str`` keeps ``"launcher"`` a string);
* ``int`` wants an integer (not a boolean), ``float`` an integer or a float (read as a
  float), ``str`` and ``bool`` themselves; ``Any`` takes anything.

A value that breaks a rule raises :class:`ProtocolError` naming the record, the path to the
field (``StatusAnswer.ranks[0].pid``) and what it wanted, so the reader of another version
sees which field moved. :meth:`Record.to_dict` is the writer's half: ``asdict``, which these
rules read back to an equal record.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar, Union

R = TypeVar("R", bound="Record")


class ProtocolError(ValueError):
    """A record without the shape this side knows (a writer of another version)."""


class Record:
    """A dataclass that crosses a process or a host as one JSON object."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls: type[R], doc: Any) -> R:
        return decode(cls, doc)


class _Mismatch(Exception):
    """A value that does not fit its annotation; ``path`` is filled in on the way out."""

    def __init__(self, want: str, got: Any, *, inside: bool = False) -> None:
        super().__init__(want)
        self.want, self.got, self.path = want, got, ""
        self.inside = inside    # the value had the right shape; a part of it did not


def decode(kind: Any, value: Any) -> Any:
    """``value`` (parsed JSON) as ``kind`` (a record type, usually); ProtocolError if not."""
    try:
        return _read(kind, value)
    except _Mismatch as bad:
        name = getattr(kind, "__name__", str(kind))
        sep = " " if bad.want.endswith(" in") else ", got "
        raise ProtocolError(f"{name}{bad.path}: {bad.want}{sep}{bad.got!r:.160}") from None


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    """The field annotations of ``cls``, resolved once (they are strings under
    ``from __future__ import annotations``)."""
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _read(kind: Any, value: Any) -> Any:
    if kind is Any:
        return value
    if dataclasses.is_dataclass(kind):
        return _read_record(kind, value)
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (Union, types.UnionType):
        return _read_union(kind, args, value)
    if origin is list:
        if not isinstance(value, list):
            raise _Mismatch(f"want a list of {_name(args[0])}", value)
        return [_at(f"[{i}]", args[0], item) for i, item in enumerate(value)]
    if origin is dict:
        if not isinstance(value, Mapping):
            raise _Mismatch(f"want an object of {_name(args[1])}", value)
        return {_key(args[0], k): _at(f"[{k!r}]", args[1], v) for k, v in value.items()}
    if kind is type(None):
        if value is not None:
            raise _Mismatch("want null", value)
        return None
    return _read_scalar(kind, value)


def _read_record(cls: type, value: Any) -> Any:
    if not isinstance(value, Mapping):
        raise _Mismatch(f"want a JSON object for {cls.__name__}", value)
    hints, got = _hints(cls), {}
    for f in dataclasses.fields(cls):
        if f.name in value:
            got[f.name] = _at(f".{f.name}", hints[f.name], value[f.name])
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise _Mismatch(f"no {f.name!r} in", dict(value), inside=True)
    return cls(**got)


def _read_union(kind: Any, arms: tuple[Any, ...], value: Any) -> Any:
    if value is None and type(None) in arms:
        return None
    for arm in arms:
        if arm is type(None):
            continue
        try:
            return _read(arm, value)
        except _Mismatch as bad:
            if bad.inside:      # the arm fitted, a field inside it did not: say which
                raise
    raise _Mismatch(f"want {_name(kind)}", value)


def _read_scalar(kind: Any, value: Any) -> Any:
    if kind is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if kind is int and isinstance(value, bool):
        raise _Mismatch("want int", value)
    if kind in (int, str, bool) and isinstance(value, kind):
        return value
    raise _Mismatch(f"want {_name(kind)}", value)


def _key(kind: Any, key: str) -> Any:
    """An object's key as ``kind``: JSON spells every key as a string."""
    arms = typing.get_args(kind) if typing.get_origin(kind) in (Union, types.UnionType) \
        else (kind,)
    for arm in arms:
        if arm is int and isinstance(key, str) and key.lstrip("-").isdigit():
            return int(key)
        if arm is int and isinstance(key, int) and not isinstance(key, bool):
            return key
        if arm is str and isinstance(key, str):
            return key
    raise _Mismatch(f"want a key of {_name(kind)}", key)


def _at(step: str, kind: Any, value: Any) -> Any:
    """``_read`` of a part, prefixing the part's place to any mismatch inside it."""
    try:
        return _read(kind, value)
    except _Mismatch as bad:
        bad.path, bad.inside = step + bad.path, True
        raise


def _name(kind: Any) -> str:
    if typing.get_origin(kind) in (Union, types.UnionType):
        return " | ".join(_name(arm) for arm in typing.get_args(kind))
    if kind is type(None):
        return "None"
    return getattr(kind, "__name__", str(kind))
