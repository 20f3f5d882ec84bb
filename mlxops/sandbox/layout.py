"""Names and addresses of one sandbox instance, derived from (prefix, subnet).

Every kernel object a sandbox makes carries its prefix, and every address comes from its
subnet, so two sandboxes (a user's and the test suite's) never collide and ``down`` can
name exactly what ``up`` made. Pure logic: nothing here touches the host.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterator
from dataclasses import dataclass

from mlxops.errors import UserError

DEFAULT_PREFIX = "mxsb"
DEFAULT_SUBNET = "10.231.0.0/24"
NODE_USER = "mlxnode"
# The node user's login shell: sshd runs every remote command under it. A stock Mac's is
# zsh (since macOS 10.15); each shell has its own account, since the shell is the
# account's (passwd), and two sandboxes of different shells may run at once.
LOGIN_SHELLS = {"bash": "/bin/bash", "zsh": "/usr/bin/zsh"}
SHELL_USERS = {"bash": NODE_USER, "zsh": "mlxnodez"}
FIRST_NODE_HOST = 11  # node1 is .11, node2 .12, ...; .1 is the controller

# Interface names are at most 15 bytes: prefix + "v" + up to 4 digits, or prefix + "br".
_PREFIX = re.compile(r"^[a-z][a-z0-9]{0,9}$")


@dataclass(frozen=True)
class NodeLayout:
    name: str
    ip: str
    netns: str
    veth: str  # host side, enslaved to the bridge; the node side is eth0 in the netns


@dataclass(frozen=True)
class Layout:
    prefix: str
    subnet: ipaddress.IPv4Network

    @classmethod
    def make(cls, prefix: str = DEFAULT_PREFIX, subnet: str = DEFAULT_SUBNET) -> Layout:
        if not _PREFIX.match(prefix):
            raise UserError(f"--prefix: {prefix!r}: want 1-10 of [a-z0-9], starting a-z")
        try:
            net = ipaddress.IPv4Network(subnet, strict=True)
        except ValueError as exc:
            raise UserError(f"--subnet: {subnet!r}: {exc}") from None
        if net.prefixlen > 28:
            raise UserError(f"--subnet: {subnet}: too small, want /28 or larger")
        return cls(prefix, net)

    @property
    def bridge(self) -> str:
        return f"{self.prefix}br"

    @property
    def controller_ip(self) -> str:
        return str(self.subnet.network_address + 1)

    @property
    def max_nodes(self) -> int:
        # Hosts .11 up to the last address before broadcast.
        return self.subnet.num_addresses - 1 - FIRST_NODE_HOST

    def node(self, index: int) -> NodeLayout:
        """Node number ``index`` (1-based)."""
        if not 1 <= index <= self.max_nodes:
            raise UserError(f"--nodes: {index}: subnet {self.subnet} holds 1..{self.max_nodes}")
        return NodeLayout(
            name=f"node{index}",
            ip=str(self.subnet.network_address + FIRST_NODE_HOST - 1 + index),
            netns=f"{self.prefix}-node{index}",
            veth=f"{self.prefix}v{index}",
        )

    def nodes(self, count: int) -> list[NodeLayout]:
        if count < 1:
            raise UserError(f"--nodes: {count}: want at least 1")
        return [self.node(i) for i in range(1, count + 1)]


@dataclass(frozen=True)
class SubnetPool:
    """Where ``up`` picks its subnet itself (under the machine's sandbox lock): the first
    ``10.<o>.<n>.0/24`` (``o`` in ``second_octets``) that nothing here uses, trying them
    from ``seed`` on (a pid: concurrent callers start apart)."""

    second_octets: range
    seed: int

    def candidates(self) -> Iterator[ipaddress.IPv4Network]:
        count = len(self.second_octets) * 250
        for step in range(count):
            n = (self.seed + step) % count
            yield ipaddress.IPv4Network(f"10.{self.second_octets[n // 250]}.{n % 250}.0/24")

    def describe(self) -> str:
        return f"10.{self.second_octets[0]}-{self.second_octets[-1]}.x.0/24"


_RATE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|bps|kbps|mbps|gbps)$", re.IGNORECASE)
_RATE_UNIT = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9,
              "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9}


def parse_rate(rate: str) -> int:
    """``200mbit`` -> 200_000_000 bits/s, in tc's units (kbit = 1000 bit, bps = bytes/s)."""
    match = _RATE.match(rate.strip())
    if not match:
        raise UserError(f"--rate: {rate!r}: want e.g. 200mbit, 1gbit, 500kbit")
    bits = int(float(match.group(1)) * _RATE_UNIT[match.group(2).lower()])
    if bits < 8000:
        raise UserError(f"--rate: {rate!r}: too slow, want at least 8kbit")
    return bits


def node_rates(specs: list[str] | tuple[str, ...], names: list[str]
               ) -> dict[str, str | None]:
    """``--rate`` values, each ``RATE`` (every node) or ``NODE=RATE`` (that node, winning),
    as each node's rate (None: not shaped). Checked before anything is made."""
    default: str | None = None
    own: dict[str, str] = {}
    for spec in specs:
        name, sep, rate = spec.partition("=")
        if not sep:
            name, rate = "", spec
        parse_rate(rate)
        if not name:
            default = rate
        elif name not in names:
            raise UserError(f"--rate: {spec!r}: no node {name!r} (the nodes are "
                            f"{names[0]}..{names[-1]})")
        else:
            own[name] = rate
    return {name: own.get(name, default) for name in names}


def tbf_burst_bytes(bits_per_sec: int) -> int:
    """A bucket big enough for the rate at a 100 Hz timer tick (tbf drops otherwise),
    and never below 64 KiB so one GSO super-packet fits."""
    return max(bits_per_sec // 8 // 100, 64 * 1024)
