"""Which pairs of nodes share a link, of what kind, and each node's data address.

Policy (a pure rule, no I/O). Each node says what its interfaces are (``networksetup
-listallhardwareports`` on a Mac: ``Hardware Port: Thunderbolt 1`` / ``Device: en2``, the
map ``mlx.distributed_config`` reads; parsed by :func:`mlxops.macnet.parse_hardware_ports`)
and which IPv4 addresses they carry, with their netmask (``ifconfig``; ``ip -o -4 addr`` on
Linux). A kind per interface, by the data-link rule that ``check_data_link`` uses too
(:func:`mlxops.datalink.interface_kind`):

    thunderbolt  the port is "Thunderbolt N"
    ethernet     a port whose name says Ethernet or LAN; with no hardware port, any name
                 but ``wl*`` (eth0, a Mac's unlisted device)
    bridge       "Thunderbolt Bridge" (bridge0, listed or not on a Mac)
    other        any other port (iPhone USB, Bluetooth PAN)
    wifi         "Wi-Fi" / "AirPort" (or, with no hardware ports, a ``wl*`` name)

The Thunderbolt Bridge is its own kind, not Thunderbolt: MLX's ring and RDMA need it off
(mlxops/datalink.py says why), so a data address on it is a fallback, never the
Thunderbolt link init looks for.

Nodes A and B share a link of kind K when an address of A on a K interface and an address
of B on a K interface lie in one subnet (``addr & mask`` equal, by A's mask and by B's):
the address of B that A reaches without a router. One mix is a link too: a Thunderbolt
port facing a Thunderbolt Bridge (one Mac has its bridge on) is a bridge link, at both
ends (:func:`link_kind`). Where ``reached`` is given (each node
tried a TCP connection to its peers' addresses in its subnets, :func:`peer_targets`), a
link also needs each side to have reached the other's address on it.

The data address of a node is its address on the fastest kind it shares with any peer,
ranked by :data:`mlxops.datalink.RANK`

    thunderbolt  <  ethernet  <  bridge  <  other  <  wifi        (smaller is faster)

ties going to the link shared with the most peers, then to the interface listed first.
A node with no peer (a cluster of one, or on no common subnet) keeps the address SSH
reaches (``ansible_host``), said so in the comment.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from mlxops.datalink import BRIDGE, NAMES, RANK, THUNDERBOLT, interface_kind


@dataclass(frozen=True)
class Address:
    iface: str
    ip: str
    prefix: int  # netmask length

    @property
    def network(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(f"{self.ip}/{self.prefix}", strict=False)


@dataclass
class NodeLinks:
    """One node's interfaces as it reported them."""

    ports: dict[str, str] = field(default_factory=dict)   # device -> hardware port name
    addresses: list[Address] = field(default_factory=list)

    def kind(self, iface: str) -> str:
        return interface_kind(iface, self.ports)


@dataclass(frozen=True)
class DataAddress:
    """The address a node's peers use (``mlxops_ip``) and why."""

    ip: str | None          # None: keep ansible_host
    kind: str | None
    iface: str | None
    port: str | None        # the hardware port's name, when the node said
    peers: tuple[str, ...]  # the nodes reached on it

    def comment(self) -> str:
        if self.ip is None or self.kind is None:
            return "data link: none found to a peer; the ranks use the SSH address"
        port = f", {self.port}" if self.port and self.port != NAMES[self.kind] else ""
        return (f"data link: {NAMES[self.kind]} ({self.iface}{port}) to "
                f"{', '.join(self.peers)}")


def parse_ifconfig_addresses(text: str) -> list[Address]:
    """macOS ``ifconfig``: every IPv4 ``inet X netmask 0xffffff00`` with its interface
    (loopback left out)."""
    found, iface = [], None
    for line in text.splitlines():
        head = re.match(r"^([A-Za-z0-9_.-]+): flags=", line)
        if head:
            iface = head.group(1)
            continue
        words = line.split()
        if iface and len(words) >= 4 and words[0] == "inet" and words[2] == "netmask":
            mask = int(words[3], 16) if words[3].startswith("0x") else \
                int(ipaddress.IPv4Address(words[3]))
            found.append(Address(iface, words[1], bin(mask).count("1")))
    return [a for a in found if not a.ip.startswith("127.")]


def parse_ip_addr(text: str) -> list[Address]:
    """Linux ``ip -o -4 addr show``: ``2: eth0    inet 10.0.0.2/24 brd ...``."""
    found = []
    for line in text.splitlines():
        m = re.match(r"^\d+:\s+(\S+)\s+inet\s+([\d.]+)/(\d+)", line)
        if m and not m.group(2).startswith("127."):
            found.append(Address(m.group(1).split("@")[0], m.group(2), int(m.group(3))))
    return found


def _same_subnet(a: Address, b: Address) -> bool:
    return ipaddress.IPv4Address(b.ip) in a.network and ipaddress.IPv4Address(a.ip) in b.network


Pair = tuple[str, str]


def peer_targets(nodes: Mapping[str, NodeLinks]) -> dict[str, list[str]]:
    """For each node, the peers' addresses in a subnet of its own (what it should reach)."""
    return {a: sorted({addr_b.ip for b, nb in nodes.items() if b != a
                       for addr_b in nb.addresses for addr_a in na.addresses
                       if _same_subnet(addr_a, addr_b)})
            for a, na in nodes.items()}


def link_kind(a: str, b: str) -> str | None:
    """The kind of a link whose two ends are interfaces of kinds ``a`` and ``b``: their one
    kind; a Thunderbolt port facing a Thunderbolt Bridge is a bridge link (one cable,
    bridged at one end, so not the Thunderbolt link the ring and RDMA need); None for
    any other mix (a subnet spanning two media is no direct link)."""
    if a == b:
        return a
    return BRIDGE if {a, b} == {THUNDERBOLT, BRIDGE} else None


def shared_links(nodes: Mapping[str, NodeLinks], reached: set[Pair] | None = None
                 ) -> dict[Pair, list[tuple[str, Address]]]:
    """``{(a, b): [(kind, a's address), ...]}`` for every ordered pair sharing a subnet on
    interfaces whose :func:`link_kind` is one (the fastest such kind per address of a);
    ``reached``: ``(node, address)`` pairs that connected, both ways required."""
    def ok(a: str, addr_a: Address, b: str, addr_b: Address) -> bool:
        return reached is None or ((a, addr_b.ip) in reached and (b, addr_a.ip) in reached)

    links: dict[Pair, list[tuple[str, Address]]] = {}
    for a, na in nodes.items():
        for b, nb in nodes.items():
            if a == b:
                continue
            for addr_a in na.addresses:
                kinds = [kind for addr_b in nb.addresses
                         if (kind := link_kind(na.kind(addr_a.iface), nb.kind(addr_b.iface)))
                         and _same_subnet(addr_a, addr_b) and ok(a, addr_a, b, addr_b)]
                if kinds:
                    links.setdefault((a, b), []).append((min(kinds, key=RANK.get), addr_a))
    return links


def data_addresses(nodes: Mapping[str, NodeLinks], order: Sequence[str] | None = None,
                   reached: set[Pair] | None = None) -> dict[str, DataAddress]:
    """Every node's :class:`DataAddress` by the rule in the module's docstring: each of its
    addresses with the kind of link it has to a peer, one candidate per (address, kind)."""
    links = shared_links(nodes, reached)
    chosen: dict[str, DataAddress] = {}
    for name in order or list(nodes):
        node = nodes[name]
        best: tuple | None = None
        for index, addr in enumerate(node.addresses):
            by_kind: dict[str, list[str]] = {}
            for b in nodes:
                for kind, x in links.get((name, b), ()):
                    if x == addr:
                        by_kind.setdefault(kind, []).append(b)
            for kind, peers in by_kind.items():
                key = (RANK[kind], -len(peers), index)
                if best is None or key < best[0]:
                    best = (key, DataAddress(addr.ip, kind, addr.iface,
                                             node.ports.get(addr.iface), tuple(peers)))
        chosen[name] = best[1] if best else DataAddress(None, None, None, None, ())
    return chosen
