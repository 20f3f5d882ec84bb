"""Ansible reads our inventories the way we do: ``ansible-inventory -i FILE --list``.

For the example inventories and every valid fixture, compare each host's resolved vars
and group membership with Ansible's. Needs ansible-core (``pip install ansible-core``);
skipped, saying so, when ``ansible-inventory`` is neither on PATH nor beside this Python.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mlxops.inventory import load_inventory

ROOT = Path(__file__).parents[3]
DATA = Path(__file__).parents[1] / "data" / "inventories"
INVENTORIES = [
    ROOT / "inventory" / "local.yml",
    ROOT / "inventory" / "cluster.example.yml",
    *sorted(DATA.glob("*/inventory.yml")),
]
INVENTORIES = [p for p in INVENTORIES if p.parent.parent.name != "errors"]


def _ansible_inventory() -> str | None:
    beside = Path(sys.executable).parent / "ansible-inventory"
    return str(beside) if beside.exists() else shutil.which("ansible-inventory")


ANSIBLE_INVENTORY = _ansible_inventory()
pytestmark = pytest.mark.skipif(
    ANSIBLE_INVENTORY is None,
    reason="ansible-inventory not found (pip install ansible-core) - compatibility unchecked")


def _ansible_list(path: Path, tmp_path: Path) -> dict:
    config = tmp_path / "ansible.cfg"
    config.write_text("")
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(config),  # no user or project config changes the answer
        "ANSIBLE_HOME": str(tmp_path),
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"),
        "ANSIBLE_INVENTORY_ENABLED": "yaml",  # read it as YAML or fail, no other plugin
        "ANSIBLE_INVENTORY_UNPARSED_FAILED": "true",
    }
    proc = subprocess.run([ANSIBLE_INVENTORY, "-i", str(path), "--list"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)  # Ansible refuses a non-blocking stdin
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _ansible_groups(listing: dict) -> dict[str, set[str]]:
    """host -> Ansible's group_names, from the --list tree (direct hosts + children)."""
    parents: dict[str, set[str]] = {}
    for group, body in listing.items():
        for child in body.get("children", []) if group != "_meta" else []:
            parents.setdefault(child, set()).add(group)

    def ancestors(group: str) -> set[str]:
        found = {group}
        for parent in parents.get(group, ()):
            found |= ancestors(parent)
        return found

    membership: dict[str, set[str]] = {}
    for group, body in listing.items():
        for host in body.get("hosts", []) if group != "_meta" else []:
            membership.setdefault(host, set()).update(ancestors(group))
    return {host: groups - {"all"} for host, groups in membership.items()}


@pytest.mark.parametrize("path", INVENTORIES, ids=lambda p: str(p.relative_to(ROOT)))
def test_same_hosts_vars_and_groups_as_ansible(path: Path, tmp_path: Path) -> None:
    listing = _ansible_list(path, tmp_path)
    ours = load_inventory(path)
    hostvars = listing["_meta"]["hostvars"]
    assert sorted(ours.hosts) == sorted(hostvars)
    groups = _ansible_groups(listing)
    for name, host in ours.hosts.items():
        assert dict(host.vars) == hostvars[name], name
        assert set(host.groups) == groups.get(name, set()), name
