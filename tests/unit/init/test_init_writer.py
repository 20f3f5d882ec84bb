"""The inventory ``mlxops init`` writes (mlxops/init/writer.py): Ansible's format, a
group per chip family, and a re-run that adds only what is new, keeping the user's
values, comments and order."""

from __future__ import annotations

import yaml

from mlxops.init import writer
from mlxops.init.hosts import inventory_name, parse_spec
from mlxops.init.links import DataAddress
from mlxops.init.starter import Node, size

TB = DataAddress("10.0.0.1", "thunderbolt", "en1", "Thunderbolt 1", ("studio-2",))


def host(name: str, address: str, data: DataAddress = TB) -> writer.NewHost:
    return writer.NewHost(name, address, None, "m2_ultra", data, "/opt/homebrew/bin/python3",
                          1, "Apple M2 Ultra, 192 GiB, macOS 14.4.1 (23E224), mlx 0.32.4")


def test_first_write_is_ansible_yaml_with_comments():
    doc = writer.load(None)
    assert writer.merge(doc, [host("studio-1", "192.168.1.21")],
                        {"ansible_user": "mlx", "mlxops_known_hosts": None}) == ["studio-1"]
    text = writer.dump(doc)
    assert yaml.safe_load(text) == {"all": {
        "vars": {"ansible_user": "mlx"},
        "children": {"m2_ultra": {"hosts": {"studio-1": {
            "ansible_host": "192.168.1.21", "mlxops_ip": "10.0.0.1",
            "mlxops_python": "/opt/homebrew/bin/python3", "mlxops_slots": 1}}}}}}
    assert "        # Apple M2 Ultra, 192 GiB, macOS 14.4.1 (23E224), mlx 0.32.4\n" \
           "        studio-1:\n" in text
    assert "mlxops_ip: 10.0.0.1  # data link: Thunderbolt (en1, Thunderbolt 1) to studio-2" \
        in text


def test_rerun_keeps_everything_the_user_wrote():
    mine = ("# my cluster\n"
            "all:\n"
            "  vars:\n"
            "    ansible_user: admin   # not mlx\n"
            "  children:\n"
            "    studios:\n"
            "      hosts:\n"
            "        studio-1:\n"
            "          ansible_host: 192.168.1.21\n"
            "          mlxops_slots: 2  # two ranks here\n")
    doc = writer.load(mine)
    added = writer.merge(doc, [host("studio-1", "192.168.1.21"), host("x", "192.168.1.21"),
                               host("studio-2", "192.168.1.22")], {"ansible_user": "mlx"})
    assert added == ["studio-2"]  # by name or by address: already there
    text = writer.dump(doc)
    assert text.startswith(mine)
    assert yaml.safe_load(text)["all"]["vars"] == {"ansible_user": "admin"}
    assert writer.diff(mine, text, writer.Path("inv.yml")).count("\n+") >= 5


def test_chip_family_and_names():
    assert writer.chip_family("Apple M2 Ultra", "Darwin", "arm64") == "m2_ultra"
    assert writer.chip_family("Apple M4", "Darwin", "arm64") == "m4"
    assert writer.chip_family(None, "Linux", "x86_64") == "linux_x86_64"
    assert inventory_name("Studio-1.local", "192.168.1.21", []) == "studio-1"
    assert inventory_name("Studio-1.local", "studio1", []) == "studio1"  # as typed / mDNS
    assert inventory_name("box", "10.0.0.3", ["box"]) == "10.0.0.3"
    assert inventory_name("box", "My Mac", ["My-Mac"]) == "My-Mac-2"
    assert inventory_name(None, "10.0.0.2", ["10.0.0.2"]) == "10.0.0.2-2"
    assert parse_spec("mlx@studio-1").user == "mlx"
    for bad in ("a b", "-oProxyCommand=x", "u@", "x;y"):
        try:
            parse_spec(bad)
        except Exception as exc:  # noqa: BLE001
            assert "init: HOST" in str(exc)
        else:
            raise AssertionError(bad)


def test_starter_sized_for_the_smallest_node():
    # The starter model's rank needs ~17 MiB at micro-batch 8 (trainer/plan.py's estimate):
    # a node of 12 MiB holds micro-batch 4 (x2 accumulated), the big one all 8 at once.
    big, small = Node("big", 192 * 2**30, None, 1), Node("small", 12 * 2**20, None, 1)
    smallest, plan = size([big, small])
    assert smallest.name == "small"
    assert (plan.micro_batch, plan.accumulation) == (4, 2)
    _, roomy = size([big, Node("big2", 64 * 2**30, None, 1)])
    assert (roomy.micro_batch, roomy.accumulation) == (8, 1)
