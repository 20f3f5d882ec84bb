"""Loading inventories: precedence, membership, typed properties and every error path.

Fixtures are data under data/inventories/: each valid one has an expected.yml with the
resolved vars and groups of every host; each error case carries its expected message on
its first line (``# expect: ...``, paths relative to data/inventories/errors/).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from mlxops.errors import UserError
from mlxops.inventory import VARIABLES, load_inventory

DATA = Path(__file__).parents[1] / "data" / "inventories"
ERRORS = DATA / "errors"
EXPECTED = sorted(p.parent.name for p in DATA.glob("*/expected.yml"))
ERROR_CASES = sorted([*ERRORS.glob("*.yml"), *ERRORS.glob("*/inventory.yml")])


@pytest.mark.parametrize("name", EXPECTED)
def test_resolved_vars_and_groups(name: str) -> None:
    expected = yaml.safe_load((DATA / name / "expected.yml").read_text())["hosts"]
    inv = load_inventory(DATA / name / "inventory.yml")
    assert list(inv.hosts) == list(expected), "hosts are in file order"
    for host_name, want in expected.items():
        host = inv.hosts[host_name]
        assert dict(host.vars) == want["vars"], host_name
        assert list(host.groups) == want["groups"], host_name


def test_groups_record_direct_members_and_depth() -> None:
    inv = load_inventory(DATA / "multi" / "inventory.yml")
    assert inv.groups["all"].children == ("ungrouped", "gpu", "arm", "late", "edge", "racks",
                                          "solo")
    assert inv.groups["all"].hosts == ("gateway",)
    assert inv.groups["ungrouped"].hosts == ("gateway",)
    assert inv.groups["edge"].hosts == ("node3", "edge1")
    assert inv.groups["edge"].children == ("deep",)
    assert inv.groups["deep"].parents == ("edge",)
    assert (inv.groups["all"].depth, inv.groups["edge"].depth, inv.groups["deep"].depth) == (
        0, 1, 2)
    assert inv.groups["late"].priority == 5
    assert "ansible_group_priority" not in inv.groups["late"].vars  # as Ansible
    assert dict(inv.groups["gpu"].vars) == {"tier": "gpu", "depthvar": "gpu", "shared": "gpu",
                                            "redefined": "second"}


def test_group_vars_include_their_files() -> None:
    inv = load_inventory(DATA / "precedence" / "inventory.yml")
    assert inv.groups["macs"].vars["inv_vs_file_macs"] == "file-macs"
    assert inv.groups["studios"].vars["dir_order"] == "second"


def test_host_properties_defaults() -> None:
    inv = load_inventory(DATA / "connection" / "inventory.yml")
    plain = inv.hosts["plain"]
    assert plain.address == "plain"
    assert plain.user == "mlx"
    assert plain.port == 22
    assert plain.key_file is None
    assert plain.known_hosts is None
    assert plain.connection == "ssh"
    assert plain.become is False
    assert plain.python == "python3"
    assert plain.root == "~/.mlxops"
    assert plain.slots == 1
    assert plain.ip == "plain"
    assert plain.env == {}


def test_host_properties_set() -> None:
    path = DATA / "connection" / "inventory.yml"
    full = load_inventory(path).hosts["full"]
    assert full.address == "192.168.1.30"
    assert full.user == "admin"
    assert full.port == 2222
    assert full.key_file == path.parent / "keys" / "id_ed25519"
    assert full.known_hosts == path.parent / "keys" / "known_hosts"
    assert full.become is True
    assert full.python == "/opt/homebrew/bin/python3"
    assert full.root == "/Volumes/fast/mlxops"
    assert full.slots == 2
    assert full.ip == "10.0.0.30"
    assert full.env == {"MLX_METAL_DEBUG": "0", "NAME": "value"}
    assert full.vars["my_own_var"] == ["kept", "as", "is"]  # not ours: passed through


def test_host_paths_expand_home(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/home/someone")
    host = load_inventory(DATA / "connection" / "inventory.yml").hosts["homekey"]
    assert host.key_file == Path("/home/someone/.ssh/id_rsa")
    assert host.known_hosts == Path("/etc/ssh/ssh_known_hosts")
    assert host.connection == "local"


def test_example_inventories_load() -> None:
    root = Path(__file__).parents[3] / "inventory"
    local = load_inventory(root / "local.yml")
    assert [(h.name, h.connection, h.slots) for h in local.hosts.values()] == [
        ("localhost", "local", 3)]
    cluster = load_inventory(root / "cluster.example.yml")
    # (its key, ~/.ssh/id_ed25519, need not exist here: nothing connects)
    assert [h.name for h in cluster.select("studios", check_files=False)] == ["studio1",
                                                                               "studio2"]
    assert cluster.hosts["studio1"].ip == "10.0.0.1"
    assert cluster.hosts["mini1"].env == {"MLX_METAL_DEBUG": "0"}


def test_registry_documents_every_variable() -> None:
    for name, var in VARIABLES.items():
        assert var.name == name
        assert var.doc and "\n" not in var.doc
        if var.default is not None:
            var.parse(var.default)  # defaults pass their own validation
    for name in ("mlxops_python", "mlxops_root", "mlxops_slots", "mlxops_ip", "mlxops_env",
                 "mlxops_known_hosts", "mlxops_mlx_version", "mlxops_wheelhouse",
                 "mlxops_wired_limit_mb", "mlxops_btl_tcp_links",
                 "mlxops_btl_tcp_if_include", "mlxops_metal_fast_synch"):
        assert name in VARIABLES


def test_docs_have_a_row_for_every_variable() -> None:
    reference = (Path(__file__).parents[3] / "docs" / "inventory.md").read_text()
    rows = set(re.findall(r"^\| `([a-z_]+)` \|", reference, re.M))
    assert set(VARIABLES) <= rows, sorted(set(VARIABLES) - rows)


def _expected_message(case: Path) -> str:
    first = case.read_text().splitlines()[0]
    assert first.startswith("# expect: "), f"{case} lacks its '# expect:' line"
    return first.removeprefix("# expect: ")


@pytest.mark.parametrize("case", ERROR_CASES, ids=lambda p: str(p.relative_to(ERRORS)))
def test_error_is_one_line_naming_file_and_key(case: Path) -> None:
    with pytest.raises(UserError) as info:
        load_inventory(case)
    message = str(info.value)
    assert "\n" not in message
    assert message.replace(f"{ERRORS}/", "") == _expected_message(case)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"^.*/nope\.yml: no such file$"):
        load_inventory(tmp_path / "nope.yml")


def test_directory_given(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r": is a directory, not an inventory file$"):
        load_inventory(tmp_path)


def test_unreadable_file(tmp_path: Path) -> None:
    path = tmp_path / "inventory.yml"
    path.write_bytes(b"all:\n  hosts:\n    mac\xff:\n")
    with pytest.raises(UserError, match=r"inventory\.yml: cannot read: "):
        load_inventory(path)


def test_ring_order_is_the_inventory_order_every_rank_order_follows(tmp_path) -> None:
    from mlxops.jobs.placement import place_ranks
    from mlxops.render import launch_hostfile

    (tmp_path / "group_vars").mkdir()
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump({"all": {
        "vars": {"mlxops_ring_order": ["mac4", "mac1"]},
        "children": {"macs": {"hosts": {f"mac{i}": {"ansible_host": f"10.0.0.{i}"}
                                        for i in range(1, 5)}}}}}))
    inv = load_inventory(tmp_path / "inventory.yml")
    assert list(inv.hosts) == ["mac4", "mac1", "mac2", "mac3"]
    assert [h.name for h in inv.select("mac3,mac2,mac1")] == ["mac1", "mac2", "mac3"]
    assert [h.name for h in inv.select("macs[0]")] == ["mac1"]  # Ansible's group order
    ranks = place_ranks(inv.select("all"), 30000)
    assert [(r.rank, r.host, r.port) for r in ranks[:2]] == [(0, "mac4", 30000),
                                                           (1, "mac1", 30001)]
    ring = json.loads(launch_hostfile(inv.select("mac1,mac3,mac4"), "ring"))
    assert [entry["ips"] for entry in ring["hosts"]] == [["10.0.0.4"], ["10.0.0.1"], ["10.0.0.3"]]

    # group_vars/all overrides the file's all: vars, as any variable.
    (tmp_path / "group_vars" / "all.yml").write_text("mlxops_ring_order: [mac2, mac3]\n")
    assert list(load_inventory(tmp_path / "inventory.yml").hosts) == ["mac2", "mac3", "mac1",
                                                                      "mac4"]
