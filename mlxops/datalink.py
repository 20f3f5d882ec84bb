"""The data plane apart from the management plane: which link a host's data address is on.

Two addresses per host (docs/inventory.md): ``ansible_host``, the management address, is
where SSH goes; ``mlxops_ip`` (default: ``ansible_host``), the data address, is what the
ring hostfile, jaccl's coordinator and ``bench``'s links use, so the training traffic goes
where it says. A hostfile that takes the LAN address sends that traffic over Wi-Fi
(exo-explore/exo#2295: 3x slower).

The rule (pure, over the facts: ``ifconfig``'s addresses, ``networksetup
-listallhardwareports``' port names, see mlxops/macnet.py):

- the data address's interface is the one whose IPv4 addresses include it; its kind is
  its hardware port's (:func:`kind_of`): ``Thunderbolt N`` -> thunderbolt, ``Thunderbolt
  Bridge`` -> bridge, ``Wi-Fi`` -> wifi, a port whose name says Ethernet or LAN ->
  ethernet, any other port (iPhone USB, Bluetooth PAN) -> other;
- a finding when that kind is wifi; and when the data address is the management address
  on a link slower than Thunderbolt while a Thunderbolt port of the host has an address
  (the data could go there). Speeds rank thunderbolt > ethernet > bridge > other > wifi
  (:data:`RANK`).
- the fix names the faster link: an addressed interface of a better kind, else the
  Thunderbolt ports (to cable and address, provision's ``thunderbolt_ips`` task).

Only Macs say what their ports are; elsewhere the kind is unknown and nothing is found.

The Thunderbolt Bridge (``bridge0``) is not a Thunderbolt data link, though its members
are Thunderbolt ports: MLX's ring wants each cable as its own interface on its own subnet,
and RDMA (jaccl) fails to set up (``errno 22``) while the bridge holds the ports, so the
bridge has to be off for either (mlxops/rdmaready.py, rule 6). Traffic over it
still crosses the cable, faster than Wi-Fi, so it ranks after Ethernet and before the rest.

``mlxops init`` ranks the links it finds between nodes by the same kinds and :data:`RANK`
(mlxops/init/links.py); it also meets interfaces no hardware port names, which
:func:`interface_kind` classes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from mlxops.hostfacts import HostFacts

THUNDERBOLT, ETHERNET, BRIDGE, WIFI, OTHER = "thunderbolt", "ethernet", "bridge", "wifi", "other"
#: Faster first.
RANK = {THUNDERBOLT: 0, ETHERNET: 1, BRIDGE: 2, OTHER: 3, WIFI: 4}
NAMES = {THUNDERBOLT: "Thunderbolt", ETHERNET: "Ethernet", BRIDGE: "Thunderbolt Bridge",
         WIFI: "Wi-Fi", OTHER: "another link"}


def kind_of(port: str | None) -> str | None:
    """A hardware port's name as a kind of link; None: not a hardware port."""
    if port is None:
        return None
    if port == "Thunderbolt Bridge":
        return BRIDGE
    if port.startswith("Thunderbolt"):
        return THUNDERBOLT
    if port in ("Wi-Fi", "AirPort"):
        return WIFI
    if "Ethernet" in port or "LAN" in port:
        return ETHERNET
    return OTHER


def interface_kind(iface: str, ports: Mapping[str, str]) -> str:
    """An interface's kind of link: its hardware port's (:func:`kind_of`) where ``ports``
    (the host's ``{device: hardware port}``) lists it. Else by its name: ``bridge0`` on a
    host that lists ports (a Mac: its Thunderbolt Bridge, not listed) -> bridge; ``wl*``
    (Linux's Wi-Fi) -> wifi; anything else (``eth0``, a Mac's unlisted device) -> ethernet."""
    kind = kind_of(ports.get(iface))
    if kind is not None:
        return kind
    if iface == "bridge0" and ports:
        return BRIDGE
    return WIFI if iface.startswith("wl") else ETHERNET


@dataclass(frozen=True)
class DataLink:
    """Where a host's data address is: its interface and the kind of link."""

    ip: str
    interface: str | None
    kind: str | None

    @property
    def named(self) -> str:
        if self.interface is None:
            return f"{self.ip} (on no interface of the host)"
        return f"{self.ip} on {self.interface} ({NAMES.get(self.kind, 'kind unknown')})"


def _kinds(facts: HostFacts) -> dict[str, str]:
    ports = facts.macos.hardware_ports if facts.macos else {}
    return {iface: kind for iface, port in ports.items() if (kind := kind_of(port))}


def data_link(facts: HostFacts, ip: str) -> DataLink:
    """The interface the host holds ``ip`` on, and its kind of link."""
    interface = next((i for i, addrs in facts.interfaces.items() if ip in addrs), None)
    return DataLink(ip, interface, _kinds(facts).get(interface) if interface else None)


def data_link_finding(facts: HostFacts, data_ip: str, management: str
                      ) -> tuple[str, str] | None:
    """``(found, fix)`` when the host's data path is Wi-Fi, or shares SSH's slower link
    while Thunderbolt is there; None when it is fine or unknown."""
    link = data_link(facts, data_ip)
    kinds = _kinds(facts)
    if link.kind is None:
        return None
    better = sorted(((RANK[k], i) for i, k in kinds.items()
                     if RANK[k] < RANK[link.kind] and facts.interfaces.get(i)
                     and k != BRIDGE))
    thunderbolt = sorted(i for i, k in kinds.items() if k == THUNDERBOLT)
    if better:
        iface = better[0][1]
        fix = (f"set mlxops_ip to its address on {iface} "
               f"({NAMES[kinds[iface]]}, {facts.interfaces[iface][0]})")
    elif thunderbolt:
        fix = (f"cable the Macs over Thunderbolt ({', '.join(thunderbolt)}), give the ports "
               "addresses (provision's thunderbolt_ips task) and set mlxops_ip to one")
    else:
        fix = "set mlxops_ip to an address on a wired link"
    if link.kind == WIFI:
        return (f"the data address {link.named}: the ring's traffic goes over Wi-Fi "
                "(several times slower)", fix)
    if data_ip == management and any(kinds[i] == THUNDERBOLT for _, i in better):
        return (f"the data address {link.named} is the SSH address, on a slower link than "
                "Thunderbolt", fix)
    return None
