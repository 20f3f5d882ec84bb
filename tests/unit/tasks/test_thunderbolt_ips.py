"""The opt-in thunderbolt_ips task's plan (mlxops/tasks/thunderbolt_ips.py): facts from
output recorded on a real Mac (networksetup's hardware ports, osaurus-ai/osaurus's
DistributedFixtures.swift; mlxops/sandbox/darwin/recorded/README.md). The
``networksetup -getinfo`` answers below are MADE UP: no recording of that command's output
was found; they follow the "Manual Configuration" / "IP address:" / "Subnet mask:" lines
networksetup(8) describes."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlxops import macnet
from mlxops.errors import UserError
from mlxops.hostfacts import HostFacts, MacState
from mlxops.inventory.validators import Invalid, thunderbolt_ips
from mlxops.sandbox import darwin
from mlxops.tasks.thunderbolt_ips import parse_getinfo, steps_for

PORTS = macnet.parse_hardware_ports(
    (Path(darwin.__file__).parent / "recorded" / "networksetup-listallhardwareports.txt")
    .read_text())
MANUAL = ("Manual Configuration\nIP address: 10.0.0.1\nSubnet mask: 255.255.255.252\n"
          "Router: (null)\n")   # made up, see the module docstring
OTHER = MANUAL.replace("10.0.0.1", "10.0.0.9")
NO_SERVICE = "** Error: The parameters were not valid.\n"   # made up


def mac(members=()) -> HostFacts:
    facts = HostFacts.unknown()
    facts.system = "Darwin"
    facts.macos = MacState(wired_limit_mb=0, sleep=0, thunderbolt_bridge_up=False,
                           bridge_members=list(members), hardware_ports=PORTS)
    return facts


def test_a_port_without_a_service_gets_one_and_its_address():
    steps = steps_for(mac(), {"en2": "10.0.0.1/30"}, {"en2": None})
    assert steps.commands == [
        ["networksetup", "-createnetworkservice", "mlxops en2", "Thunderbolt 3"],
        ["networksetup", "-setmanual", "mlxops en2", "10.0.0.1", "255.255.255.252"]]
    assert steps.diff[-2:] == ["-(none)", "+10.0.0.1 255.255.255.252"]


def test_an_addressed_port_is_left_alone_and_another_address_is_set():
    assert steps_for(mac(), {"en2": "10.0.0.1/30"}, {"en2": MANUAL}).commands == []
    steps = steps_for(mac(), {"en2": "10.0.0.1/30"}, {"en2": OTHER})
    assert steps.commands == [
        ["networksetup", "-setmanual", "mlxops en2", "10.0.0.1", "255.255.255.252"]]
    assert "-10.0.0.9 255.255.255.252" in steps.diff
    assert steps_for(mac(), {"en2": "10.0.0.1/30"}, {"en2": NO_SERVICE}).commands[0][1] \
        == "-createnetworkservice"


def test_a_device_that_is_not_a_thunderbolt_port_is_refused_naming_those_there_are():
    steps = steps_for(mac(), {"en0": "10.0.0.1/30"}, {})
    assert steps.error and "en0 is not a Thunderbolt port (Wi-Fi)" in steps.error
    assert "en1, en2, en6" in steps.error and steps.commands == []


def test_a_port_the_bridge_holds_is_warned_of():
    steps = steps_for(mac(members=["en2"]), {"en2": "10.0.0.1/30"}, {"en2": MANUAL})
    assert steps.commands == [] and "Thunderbolt Bridge" in steps.warnings[0]


def test_getinfo_reads_a_manual_address_only():
    assert parse_getinfo(MANUAL) == ("10.0.0.1", "255.255.255.252")
    assert parse_getinfo(NO_SERVICE) is None and parse_getinfo(None) is None


@pytest.mark.parametrize("value", [{"en2": "10.0.0.1"}, {"wifi": "10.0.0.1/30"},
                                   {"en2": "10.0.0.0/30"}, [], {"en2": "fe80::1/64"}])
def test_the_variable_is_checked(value):
    with pytest.raises(Invalid):
        thunderbolt_ips(value)


def test_a_bad_value_in_an_inventory_is_bad_input_naming_the_key(tmp_path):
    from mlxops.inventory import load_inventory

    path = tmp_path / "inventory.yml"
    path.write_text("all:\n  hosts:\n    mac1:\n      mlxops_thunderbolt_ips: {en2: 10.0.0.1}\n")
    with pytest.raises(UserError) as caught:
        load_inventory(path)
    assert "mlxops_thunderbolt_ips" in str(caught.value) and str(path) in str(caught.value)
