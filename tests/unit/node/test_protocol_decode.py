"""The one record decoder: what it reads back equals what was written, and a missing or
mistyped field is named with its path."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

from mlxops.node.protocol.decode import ProtocolError, Record, decode


@dataclass
class Inner(Record):
    pid: int
    load: float | None = None


@dataclass
class Outer(Record):
    name: str
    alive: bool
    inner: Inner | None
    inners: list[Inner]
    by_rank: dict[int | str, Inner]
    counts: dict[int, int] = field(default_factory=dict)
    tags: list[str] | None = None


FULL = Outer(name="j", alive=True, inner=Inner(3, 0.5), inners=[Inner(1), Inner(2, 1.0)],
             by_rank={0: Inner(7), "launcher": Inner(8)}, counts={4: 5}, tags=["a"])


@pytest.mark.parametrize("record", [
    FULL,
    Outer(name="", alive=False, inner=None, inners=[], by_rank={}),
], ids=["full", "empty"])
def test_a_record_survives_json(record):
    assert Outer.from_dict(json.loads(json.dumps(record.to_dict()))) == record


def test_keys_json_spells_as_strings_come_back_as_their_type():
    got = Outer.from_dict(json.loads(json.dumps(FULL.to_dict())))
    assert set(got.by_rank) == {0, "launcher"} and set(got.counts) == {4}


def test_unknown_keys_are_left_out_and_defaults_fill_in():
    doc = {"name": "j", "alive": True, "inner": None, "inners": [], "by_rank": {},
           "newer_field": 1}
    assert Outer.from_dict(doc) == Outer("j", True, None, [], {})


@pytest.mark.parametrize("doc,path", [
    ({"alive": True, "inner": None, "inners": [], "by_rank": {}}, "Outer: no 'name' in"),
    ({**FULL.to_dict(), "inners": [{"pid": 1}, {"load": 2.0}]}, "Outer.inners[1]: no 'pid'"),
    ({**FULL.to_dict(), "inner": {"load": 1.0}}, "Outer.inner: no 'pid'"),
    ({**FULL.to_dict(), "by_rank": {"0": {}}}, "Outer.by_rank['0']: no 'pid'"),
])
def test_a_missing_field_is_named_with_its_path(doc, path):
    with pytest.raises(ProtocolError) as raised:
        Outer.from_dict(doc)
    assert str(raised.value).startswith(path)


@pytest.mark.parametrize("change,message", [
    ({"name": 3}, "Outer.name: want str, got 3"),
    ({"alive": "yes"}, "Outer.alive: want bool"),
    ({"inner": {"pid": True}}, "Outer.inner.pid: want int, got True"),
    ({"inner": {"pid": 1.5}}, "Outer.inner.pid: want int, got 1.5"),
    ({"inner": 3}, "Outer.inner: want Inner | None, got 3"),
    ({"inners": {}}, "Outer.inners: want a list of Inner"),
    ({"counts": {"x": 1}}, "Outer.counts: want a key of int, got 'x'"),
    ({"tags": ["a", 2]}, "Outer.tags[1]: want str, got 2"),
    ("not an object", "Outer: want a JSON object for Outer"),
])
def test_a_mistyped_field_is_named_with_what_it_wanted(change, message):
    doc = {**FULL.to_dict(), **change} if isinstance(change, dict) else change
    with pytest.raises(ProtocolError) as raised:
        Outer.from_dict(doc)
    assert str(raised.value).startswith(message)


def test_an_integer_reads_as_a_float_where_a_float_is_wanted():
    got = decode(Inner, {"pid": 1, "load": 2})
    assert got == Inner(1, 2.0) and isinstance(got.load, float)

