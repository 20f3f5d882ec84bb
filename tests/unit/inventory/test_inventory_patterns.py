"""Host patterns (``--limit``, a job's ``hosts:``), cases as data in */patterns.yml.

Each fixture directory holds an inventory and a ``patterns.yml`` of ``select`` cases (the
hosts, in inventory order) and ``errors`` (the one-line message). Every ``select`` case is
also asked of ansible-core (when installed): the same hosts, as a set (Ansible's order is
its own; mlxops' is the inventory's, see patterns.py).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mlxops.errors import UserError
from mlxops.inventory import load_inventory
from mlxops.inventory.patterns import split

DATA = Path(__file__).parents[1] / "data" / "inventories"
FIXTURES = sorted(p.parent.name for p in DATA.glob("*/patterns.yml"))
CASES = {f: yaml.safe_load((DATA / f / "patterns.yml").read_text()) for f in FIXTURES}
SELECT = [(f, p, hosts) for f in FIXTURES for p, hosts in CASES[f]["select"].items()]
ERRORS = [(f, p, message) for f in FIXTURES for p, message in CASES[f]["errors"].items()]


@pytest.fixture(scope="module")
def inventories():
    return {f: load_inventory(DATA / f / "inventory.yml") for f in FIXTURES}


@pytest.mark.parametrize(("fixture", "pattern", "hosts"), SELECT)
def test_select(inventories, fixture: str, pattern: str, hosts: list[str]) -> None:
    assert [h.name for h in inventories[fixture].select(pattern)] == hosts


@pytest.mark.parametrize(("fixture", "pattern", "message"), ERRORS)
def test_select_errors(inventories, fixture: str, pattern: str, message: str) -> None:
    inv = inventories[fixture]
    with pytest.raises(UserError) as info:
        inv.select(pattern)
    assert str(info.value) == message.format(path=inv.path)


ANSIBLE_HOSTS = """
import json, sys
from ansible.inventory.manager import InventoryManager
from ansible.parsing.dataloader import DataLoader
inventory = InventoryManager(loader=DataLoader(), sources=[sys.argv[1]])
print(json.dumps({p: sorted(h.name for h in inventory.get_hosts(p))
                  for p in json.loads(sys.argv[2])}))
"""


@pytest.mark.skipif(importlib.util.find_spec("ansible") is None,
                    reason="ansible-core not installed - pattern compatibility unchecked")
@pytest.mark.parametrize("fixture", FIXTURES)
def test_ansible_selects_the_same_hosts(fixture: str, tmp_path: Path) -> None:
    cases = CASES[fixture]["select"]
    (tmp_path / "ansible.cfg").write_text("")
    env = {**os.environ, "ANSIBLE_CONFIG": str(tmp_path / "ansible.cfg"),
           "ANSIBLE_HOME": str(tmp_path), "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"),
           "ANSIBLE_INVENTORY_ENABLED": "yaml", "ANSIBLE_INVENTORY_UNPARSED_FAILED": "true"}
    proc = subprocess.run([sys.executable, "-c", ANSIBLE_HOSTS, str(DATA / fixture /
                           "inventory.yml"), json.dumps(list(cases))], capture_output=True,
                          text=True, timeout=120, env=env, stdin=subprocess.DEVNULL, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    ansible = json.loads(proc.stdout)
    assert {p: sorted(h) for p, h in cases.items()} == ansible


def test_none_selects_all(inventories) -> None:
    inv = inventories["multi"]
    assert inv.select(None) == list(inv.hosts.values())


def test_source_names_where_the_pattern_came_from(inventories) -> None:
    with pytest.raises(UserError, match=r"^job\.yml: hosts: no host or group named 'x' in "):
        inventories["multi"].select("x", source="job.yml: hosts")


@pytest.mark.parametrize(("pattern", "parts"), [
    ("a,b", ["a", "b"]),
    ("a:b:!c", ["a", "b", "!c"]),
    ("a:b,c", ["a:b", "c"]),            # a comma wins: ':' is then part of the name
    ("mac-[1:3]:gpu", ["mac-[1:3]", "gpu"]),
    ("web[0:2]", ["web[0:2]"]),
    (" a , b ,", ["a", "b"]),
    ("a b !c", ["a", "b", "!c"]),       # whitespace separates, as in Ansible
    ("a b,c", ["a b", "c"]),            # ... unless there is a comma (as in Ansible)
])
def test_split(pattern: str, parts: list[str]) -> None:
    assert split(pattern) == parts
