"""The link rule of ``mlxops init`` (mlxops/init/links.py) on output recorded on real Macs:
the hardware ports of mlxops/sandbox/darwin/recorded/networksetup-listallhardwareports.txt
(an M5 Max MacBook Pro, from osaurus-ai/osaurus's DistributedFixtures.swift,
``hardwarePorts``) and ifconfig lines in the format of recorded/ifconfig-*.txt (sources in
recorded/README.md)."""

from __future__ import annotations

from pathlib import Path

from mlxops.init.links import (
    ETHERNET,
    THUNDERBOLT,
    WIFI,
    Address,
    NodeLinks,
    data_addresses,
    parse_hardware_ports,
    parse_ifconfig_addresses,
    parse_ip_addr,
    peer_targets,
)
from mlxops.sandbox import darwin

RECORDED = Path(darwin.__file__).parent / "recorded"
PORTS = parse_hardware_ports((RECORDED / "networksetup-listallhardwareports.txt").read_text())


def test_recorded_hardware_ports_name_each_device():
    assert PORTS == {"en3": "Ethernet Adapter (en3)", "bridge0": "Thunderbolt Bridge",
                     "en0": "Wi-Fi", "en1": "Thunderbolt 1", "en6": "Thunderbolt 2",
                     "en2": "Thunderbolt 3"}
    node = NodeLinks(PORTS)
    assert [node.kind(d) for d in ("en0", "en1", "en6", "bridge0", "en3")] == \
        [WIFI, THUNDERBOLT, THUNDERBOLT, THUNDERBOLT, ETHERNET]


def test_ifconfig_addresses_with_masks_from_recorded_format():
    text = (RECORDED / "ifconfig-head.txt").read_text() + (
        "en0: flags=8863<UP,BROADCAST,SMART,RUNNING,SIMPLEX,MULTICAST> mtu 1500\n"
        "\tinet 192.168.3.227 netmask 0xffffff00 broadcast 192.168.3.255\n")
    assert parse_ifconfig_addresses(text) == [Address("en0", "192.168.3.227", 24)]
    assert parse_ip_addr("2: eth0@if9    inet 10.0.0.12/24 brd 10.0.0.255 scope global eth0\n"
                         "1: lo    inet 127.0.0.1/8 scope host lo\n") == \
        [Address("eth0", "10.0.0.12", 24)]


def _mac(wifi: str, tb: str | None = None, tb_prefix: int = 30) -> NodeLinks:
    addresses = [Address("en0", wifi, 24)]
    if tb:
        addresses.append(Address("en1", tb, tb_prefix))
    return NodeLinks(dict(PORTS), addresses)


def test_thunderbolt_before_wifi_and_only_where_cabled():
    nodes = {"a": _mac("192.168.1.10", "10.0.0.1"), "b": _mac("192.168.1.11", "10.0.0.2"),
             "c": _mac("192.168.1.12")}  # c has no Thunderbolt cable
    chosen = data_addresses(nodes)
    assert (chosen["a"].ip, chosen["a"].kind, chosen["a"].peers) == ("10.0.0.1", THUNDERBOLT,
                                                                     ("b",))
    assert chosen["b"].ip == "10.0.0.2"
    assert (chosen["c"].ip, chosen["c"].kind, chosen["c"].peers) == ("192.168.1.12", WIFI,
                                                                     ("a", "b"))
    assert chosen["a"].comment() == "data link: Thunderbolt (en1, Thunderbolt 1) to b"
    assert chosen["c"].comment() == "data link: Wi-Fi (en0) to a, b"


def test_ethernet_before_wifi_on_linux_names():
    a = NodeLinks({}, [Address("wlan0", "192.168.1.10", 24), Address("eth0", "10.1.0.1", 16)])
    b = NodeLinks({}, [Address("wlan0", "192.168.1.11", 24), Address("eth0", "10.1.2.9", 16)])
    chosen = data_addresses({"a": a, "b": b})
    assert (chosen["a"].ip, chosen["a"].kind) == ("10.1.0.1", ETHERNET)


def test_a_subnet_of_other_kinds_is_no_link_and_a_lone_node_keeps_ssh():
    # a's Thunderbolt address and b's Wi-Fi address in one subnet: not one link
    a = NodeLinks(dict(PORTS), [Address("en1", "10.0.0.1", 24)])
    b = NodeLinks(dict(PORTS), [Address("en0", "10.0.0.2", 24)])
    chosen = data_addresses({"a": a, "b": b})
    assert chosen["a"].ip is None and "SSH address" in chosen["a"].comment()
    assert data_addresses({"solo": _mac("192.168.1.10")})["solo"].ip is None


def test_a_link_needs_both_sides_to_have_reached_the_other():
    nodes = {"a": _mac("192.168.1.10", "10.0.0.1"), "b": _mac("192.168.1.11", "10.0.0.2")}
    assert peer_targets(nodes) == {"a": ["10.0.0.2", "192.168.1.11"],
                                   "b": ["10.0.0.1", "192.168.1.10"]}
    # the cable is in, addresses set, but b's Thunderbolt address does not answer a
    reached = {("a", "192.168.1.11"), ("b", "192.168.1.10"), ("b", "10.0.0.1")}
    chosen = data_addresses(nodes, reached=reached)
    assert (chosen["a"].ip, chosen["a"].kind) == ("192.168.1.10", WIFI)
    reached.add(("a", "10.0.0.2"))
    assert data_addresses(nodes, reached=reached)["a"].kind == THUNDERBOLT
