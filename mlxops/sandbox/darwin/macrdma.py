"""The RDMA and network-port tools of a Mac-like sandbox node, with faults to choose.

Part of the shim program (:mod:`~mlxops.sandbox.darwin.shim` imports it; ``up`` copies
both): ``rdma_ctl status``, ``ibv_devinfo [-v]``, ``networksetup
-listallhardwareports``, ``system_profiler SPThunderboltDataType -json`` and the
Thunderbolt Bridge's ``ifconfig`` stanza, from output recorded on real Macs
(``recorded/README.md`` names each source and what is changed here).

A good node answers as a Mac ready for jaccl over ``rdma_en2``: RDMA enabled, ``rdma_en2``'s
port active, its cable to the other Mac at 80 Gb/s, no bridge, ``en0`` (the node's wire) an
Ethernet port. The node's ``faults`` file (one word a line, written by
:meth:`mlxops.sandbox.faults.Faults.mac_faults`) breaks it as a real Mac breaks:

- ``rdma-off``: ``rdma_ctl status`` says disabled and ``ibv_devinfo`` finds no device;
- ``tb4``: the cable to the other Mac runs at 40 Gb/s (a Thunderbolt 4 port);
- ``bridge``: ``bridge0`` holds ``en1`` and ``en2`` (the Thunderbolt Bridge is on);
- ``wifi``: ``en0`` is the Mac's Wi-Fi port (so is the data address on it);
- ``beta``: ``sw_vers`` answers a beta build.

Standard library only.
"""

from __future__ import annotations

from pathlib import Path

FAULTS = ("rdma-off", "tb4", "bridge", "wifi", "beta")
#: The build ``sw_vers`` answers with the ``beta`` fault: a seed's form (recorded/README.md).
BETA_BUILD = "25A5316i"
#: The device the good node's cable is on (the recorded Mac's third Thunderbolt port).
CABLED = "rdma_en2"
#: ``ibv_devinfo -v``'s limit lines for Apple's driver (recorded/README.md: measured in
#: ml-explore/mlx#3162; the lines' layout is libibverbs').
LIMITS = (("max_qp", 10), ("max_mr", 100), ("max_pd", 11))


def faults(node: Path) -> set[str]:
    try:
        return set((node / "faults").read_text().split())
    except OSError:
        return set()


def rdma_ctl(args: list[str], recorded: Path, node: Path) -> str:
    if args != ["status"]:
        raise ValueError("rdma_ctl (sandbox): only `rdma_ctl status` is answered (enable "
                         "and disable run in Recovery only)")
    if "rdma-off" in faults(node):
        return "disabled\n"
    return (recorded / "rdma_ctl-status.txt").read_text()


def ibv_devinfo(args: list[str], recorded: Path, node: Path) -> str:
    """The recorded devices, ``rdma_en2``'s port active; with ``-v`` the limits after
    ``phys_port_cnt``. Empty (no device) with RDMA off."""
    if "rdma-off" in faults(node):
        return ""
    out, device = [], None
    for line in (recorded / "ibv_devinfo.txt").read_text().splitlines():
        words = line.split()
        if words[:1] == ["hca_id:"]:
            device = words[1]
        if device == CABLED and words[:1] == ["state:"]:
            line = line.replace("PORT_DOWN (1)", "PORT_ACTIVE (4)")
        out.append(line)
        if "-v" in args and words[:1] == ["phys_port_cnt:"]:
            out += [f"\t{key}:\t\t\t{value}" for key, value in LIMITS]
    return "".join(line + "\n" for line in out)


def networksetup(args: list[str], recorded: Path, node: Path) -> str:
    """``-listallhardwareports``: the recorded ports; ``en0`` is the Ethernet adapter
    (the recorded Mac's ``en3``) unless the ``wifi`` fault leaves it the Wi-Fi."""
    if args != ["-listallhardwareports"]:
        raise ValueError("networksetup (sandbox): only -listallhardwareports is answered")
    text = (recorded / "networksetup-listallhardwareports.txt").read_text()
    if "wifi" in faults(node):
        return text
    swap = {"Device: en0": "Device: en3", "Device: en3": "Device: en0",
            "Ethernet Adapter (en3)": "Ethernet Adapter (en0)"}
    lines = []
    for line in text.splitlines():
        for old, new in swap.items():
            if old in line:
                line = line.replace(old, new)
                break
        lines.append(line)
    return "".join(line + "\n" for line in lines)


def system_profiler(args: list[str], recorded: Path, node: Path) -> str:
    if args[:1] != ["SPThunderboltDataType"]:
        return ""
    text = (recorded / "system_profiler-SPThunderboltDataType.json").read_text()
    if "tb4" in faults(node):
        # The receptacle of the bus whose cable reaches the other Mac.
        text = text.replace('"current_speed_key": "80 Gb/s"', '"current_speed_key": "40 Gb/s"')
    return text


def bridge_stanza(recorded: Path, node: Path) -> str:
    """What ``ifconfig`` adds for the Thunderbolt Bridge: nothing unless it is on."""
    return (recorded / "ifconfig-bridge.txt").read_text() if "bridge" in faults(node) else ""


def build(recorded_build: str, node: Path) -> str:
    """``sw_vers -buildVersion``: the recorded build, or a beta's with the ``beta`` fault."""
    return BETA_BUILD if "beta" in faults(node) else recorded_build
