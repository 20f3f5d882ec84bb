"""The link rule of ``mlxops init`` (mlxops/init/links.py) on output recorded on real Macs:
the hardware ports of mlxops/sandbox/darwin/recorded/networksetup-listallhardwareports.txt
(an M5 Max MacBook Pro: osaurus-ai/osaurus, DistributedFixtures.swift) and ifconfig lines
in the format of recorded/ifconfig-*.txt (sources in recorded/README.md). The kinds are
mlxops/datalink.py's, the parser mlxops/macnet.py's: the ones ``check_data_link`` uses."""

from __future__ import annotations

from pathlib import Path

from mlxops.datalink import BRIDGE, ETHERNET, OTHER, THUNDERBOLT, WIFI
from mlxops.init.links import (
    Address,
    NodeLinks,
    data_addresses,
    parse_ifconfig_addresses,
    parse_ip_addr,
    peer_targets,
)
from mlxops.macnet import parse_hardware_ports
from mlxops.sandbox import darwin

RECORDED = Path(darwin.__file__).parent / "recorded"
PORTS = parse_hardware_ports((RECORDED / "networksetup-listallhardwareports.txt").read_text())


def test_recorded_hardware_ports_have_the_data_link_kinds():
    assert PORTS == {"en3": "Ethernet Adapter (en3)", "bridge0": "Thunderbolt Bridge",
                     "en0": "Wi-Fi", "en1": "Thunderbolt 1", "en6": "Thunderbolt 2",
                     "en2": "Thunderbolt 3"}
    node = NodeLinks(PORTS)
    # the bridge is its own kind (not Thunderbolt), as check_data_link has it
    assert [node.kind(d) for d in ("en0", "en1", "bridge0", "en3")] == \
        [WIFI, THUNDERBOLT, BRIDGE, ETHERNET]
    assert NodeLinks({"en5": "iPhone USB"}).kind("en5") == OTHER


def test_interfaces_no_hardware_port_names():
    mac = NodeLinks({"en0": "Wi-Fi"})   # a Mac that does not list its bridge
    assert [mac.kind(d) for d in ("bridge0", "en9")] == [BRIDGE, ETHERNET]
    linux = NodeLinks({})
    assert [linux.kind(d) for d in ("wlan0", "eth0", "bridge0")] == [WIFI, ETHERNET, ETHERNET]


def test_the_bridge_ranks_after_ethernet_and_before_wifi():
    def node(bridge: str, lan: str, wifi: str) -> NodeLinks:
        return NodeLinks(dict(PORTS), [Address("en0", wifi, 24), Address("bridge0", bridge, 24),
                                       Address("en3", lan, 24)])
    a, b = node("10.0.0.1", "10.1.0.1", "192.168.1.10"), node("10.0.0.2", "10.1.0.2",
                                                              "192.168.1.11")
    chosen = data_addresses({"a": a, "b": b})
    assert (chosen["a"].ip, chosen["a"].kind) == ("10.1.0.1", ETHERNET)
    a.addresses.pop()  # no Ethernet: the bridge, still before Wi-Fi
    b.addresses.pop()
    chosen = data_addresses({"a": a, "b": b})
    assert (chosen["a"].ip, chosen["a"].kind) == ("10.0.0.1", BRIDGE)
    assert chosen["a"].comment() == "data link: Thunderbolt Bridge (bridge0) to b"


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


def test_a_thunderbolt_port_facing_a_bridge_is_a_bridge_link_at_both_ends():
    # a has its Thunderbolt Bridge on, b addresses its Thunderbolt port: one cable
    a = NodeLinks(dict(PORTS), [Address("en0", "192.168.1.10", 24),
                                Address("bridge0", "10.0.0.1", 30)])
    b = NodeLinks(dict(PORTS), [Address("en0", "192.168.1.11", 24),
                                Address("en1", "10.0.0.2", 30)])
    chosen = data_addresses({"a": a, "b": b})
    assert (chosen["a"].ip, chosen["a"].kind) == ("10.0.0.1", BRIDGE)
    assert (chosen["b"].ip, chosen["b"].kind) == ("10.0.0.2", BRIDGE)
    assert chosen["b"].comment() == "data link: Thunderbolt Bridge (en1, Thunderbolt 1) to a"
