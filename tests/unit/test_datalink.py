"""Which link a data address is on (mlxops/datalink.py), over facts parsed from output
recorded on real Macs: networksetup's ports from an M5 Max MacBook Pro
(osaurus-ai/osaurus, DistributedFixtures.swift), as the Mac-like sandbox node answers it
(mlxops/sandbox/darwin/recorded/README.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlxops import macnet
from mlxops.datalink import (
    BRIDGE,
    ETHERNET,
    THUNDERBOLT,
    WIFI,
    data_link,
    data_link_finding,
    kind_of,
)
from mlxops.hostfacts import HostFacts, MacState
from mlxops.sandbox import darwin

RECORDED = Path(darwin.__file__).parent / "recorded"
PORTS = macnet.parse_hardware_ports(
    (RECORDED / "networksetup-listallhardwareports.txt").read_text())


def mac(interfaces: dict[str, list[str]]) -> HostFacts:
    facts = HostFacts.unknown()
    facts.system = "Darwin"
    facts.interfaces = interfaces
    facts.macos = MacState(wired_limit_mb=0, sleep=0, thunderbolt_bridge_up=False,
                           hardware_ports=PORTS)
    return facts


def test_the_recorded_ports_have_kinds():
    assert {i: kind_of(p) for i, p in PORTS.items()} == {
        "en3": ETHERNET, "bridge0": BRIDGE, "en0": WIFI, "en1": THUNDERBOLT,
        "en6": THUNDERBOLT, "en2": THUNDERBOLT}


def test_a_data_address_on_wifi_names_the_faster_link_there_is():
    facts = mac({"en0": ["192.168.1.20"], "en3": ["10.1.0.20"]})
    assert data_link(facts, "192.168.1.20").kind == WIFI
    found, fix = data_link_finding(facts, "192.168.1.20", "192.168.1.20")
    assert "en0 (Wi-Fi)" in found
    assert "en3" in fix and "10.1.0.20" in fix


def test_wifi_alone_asks_for_thunderbolt_cables_and_addresses():
    found, fix = data_link_finding(mac({"en0": ["192.168.1.20"]}), "192.168.1.20", "mac1")
    assert "Wi-Fi" in found and "en1, en2, en6" in fix and "thunderbolt_ips" in fix


def test_the_ssh_link_for_data_while_thunderbolt_has_an_address():
    facts = mac({"en3": ["192.168.1.20"], "en2": ["10.0.0.1"]})
    found, fix = data_link_finding(facts, "192.168.1.20", "192.168.1.20")
    assert "is the SSH address" in found and "en2" in fix and "10.0.0.1" in fix


@pytest.mark.parametrize("data, management", [
    ("10.0.0.1", "192.168.1.20"),     # data on Thunderbolt, SSH on the LAN: as it should be
    ("192.168.1.20", "192.168.1.20"),  # Ethernet for both, no Thunderbolt address: fine
])
def test_good_data_paths_have_no_finding(data, management):
    facts = mac({"en3": ["192.168.1.20"]} | ({"en2": ["10.0.0.1"]} if data == "10.0.0.1"
                                              else {}))
    assert data_link_finding(facts, data, management) is None


def test_a_host_that_does_not_name_its_ports_has_no_finding():
    facts = HostFacts.unknown()
    facts.interfaces = {"eth0": ["10.0.0.5"]}
    assert data_link_finding(facts, "10.0.0.5", "10.0.0.5") is None


def test_bench_warns_of_a_data_path_on_wifi_from_the_cached_facts(tmp_path, monkeypatch):
    from mlxops.bench.run import data_link_findings
    from mlxops.inventory import Host
    from mlxops.tasks.facts import save_facts

    monkeypatch.setenv("MLXOPS_HOME", str(tmp_path))
    save_facts("mac1", mac({"en3": ["192.168.1.21"]}))
    save_facts("mac2", mac({"en0": ["192.168.1.22"], "en2": ["10.0.0.2"]}))
    hosts = [Host("mac1", {"ansible_host": "192.168.1.21"}),
             Host("mac2", {"ansible_host": "192.168.1.22"})]
    (finding,) = data_link_findings(hosts)
    assert finding["kind"] == "data_link" and finding["host"] == "mac2"
    assert "Wi-Fi" in finding["message"] and "en2" in finding["message"]
    assert data_link_findings(hosts[:1]) == []   # one host: no data path to judge
