"""Host patterns (``--limit``, a job's ``hosts:``), cases as data in multi/patterns.yml."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mlxops.errors import UserError
from mlxops.inventory import load_inventory
from mlxops.inventory.patterns import split

FIXTURE = Path(__file__).parent / "data" / "inventories" / "multi"
CASES = yaml.safe_load((FIXTURE / "patterns.yml").read_text())


@pytest.fixture(scope="module")
def inv():
    return load_inventory(FIXTURE / "inventory.yml")


@pytest.mark.parametrize(("pattern", "hosts"), CASES["select"].items())
def test_select(inv, pattern: str, hosts: list[str]) -> None:
    assert [h.name for h in inv.select(pattern)] == hosts


@pytest.mark.parametrize(("pattern", "message"), CASES["errors"].items())
def test_select_errors(inv, pattern: str, message: str) -> None:
    with pytest.raises(UserError) as info:
        inv.select(pattern)
    assert str(info.value) == message.format(path=inv.path)


def test_none_selects_all(inv) -> None:
    assert inv.select(None) == list(inv.hosts.values())


def test_source_names_where_the_pattern_came_from(inv) -> None:
    with pytest.raises(UserError, match=r"^job\.yml: hosts: no host or group named 'x' in "):
        inv.select("x", source="job.yml: hosts")


@pytest.mark.parametrize(("pattern", "parts"), [
    ("a,b", ["a", "b"]),
    ("a:b:!c", ["a", "b", "!c"]),
    ("a:b,c", ["a:b", "c"]),            # a comma wins: ':' is then part of the name
    ("mac-[1:3]:gpu", ["mac-[1:3]", "gpu"]),
    (" a , b ,", ["a", "b"]),
])
def test_split(pattern: str, parts: list[str]) -> None:
    assert split(pattern) == parts
