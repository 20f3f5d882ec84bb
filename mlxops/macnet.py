"""Facts of a Mac's network: its hardware ports and RDMA over Thunderbolt (pyinfra style).

Each fact is a command in :data:`SCRIPT` (run inside the facts command, on a Mac only) and
a pure parser here; :func:`mlxops.tasks.facts.build_facts` puts the values in the facts
record (:class:`~mlxops.hostfacts.MacState`, :class:`~mlxops.hostfacts.RdmaState`).

- ``networksetup -listallhardwareports``: which hardware port each device is
  ("Thunderbolt 2" -> ``en2``, "Wi-Fi" -> ``en0``): the kind of link a data address is on.
- ``rdma_ctl status``: RDMA switched on (in Recovery or System Settings, then a reboot).
  Only Macs with ``rdma_ctl`` (macOS 26.2+) run the RDMA commands.
- ``ibv_devinfo -v``: each RDMA device, its port's state, its link layer and its limits
  (``max_qp``, ``max_pd``, ``max_mr``: as low as 10 queue pairs and 100 memory regions on
  Apple's driver, ml-explore/mlx#3162).
- ``system_profiler SPThunderboltDataType -json``: the speed of each cable to another Mac
  (80 Gb/s: Thunderbolt 5; 40 Gb/s: Thunderbolt 4 or 3, which cannot do RDMA although
  macOS makes ``rdma_en*`` devices for them, exo-explore/exo#1813).

The recorded outputs these parsers are tested on are in mlxops/sandbox/darwin/recorded/
(sources in its README.md).
"""

from __future__ import annotations

import json
import re

from mlxops.hostfacts import RdmaDevice, RdmaState, ThunderboltLink

#: The Darwin part of the facts script: labelled sections, as the rest of it prints them.
#: stderr is dropped: a Mac without a tool prints nothing for it.
SCRIPT = r"""
  echo '@@mlxops:hardwareports'; networksetup -listallhardwareports 2>/dev/null
  if command -v rdma_ctl >/dev/null 2>&1; then
    echo '@@mlxops:rdma_ctl'; rdma_ctl status 2>/dev/null
    echo '@@mlxops:ibv_devinfo'; ibv_devinfo -v 2>/dev/null
    echo '@@mlxops:thunderbolt'; system_profiler SPThunderboltDataType -json 2>/dev/null
  fi
"""

#: Faster than this is Thunderbolt 5 (80 Gb/s, 120 with Bandwidth Boost); Thunderbolt 4
#: and 3 run at 40 Gb/s at most.
TB4_GBPS = 40


def parse_hardware_ports(text: str) -> dict[str, str]:
    """``networksetup -listallhardwareports``: ``{device: hardware port}``."""
    ports: dict[str, str] = {}
    port = None
    for line in text.splitlines():
        key, found, value = line.strip().partition(": ")
        if not found:
            continue
        if key == "Hardware Port":
            port = value.strip()
        elif key == "Device" and port is not None:
            ports[value.strip()] = port
            port = None
    return ports


def parse_rdma_ctl(text: str) -> bool | None:
    """``rdma_ctl status``: ``enabled`` / ``disabled``; None when it said neither."""
    words = text.split()
    if "enabled" in words:
        return True
    if "disabled" in words:
        return False
    return None


def parse_ibv_devinfo(text: str) -> list[RdmaDevice]:
    """``ibv_devinfo [-v]``: one record per ``hca_id:`` block, port 1's state and link
    layer, and (with ``-v``) the device's limits."""
    devices: list[RdmaDevice] = []
    current: RdmaDevice | None = None
    for line in text.splitlines():
        key, found, value = line.strip().partition(":")
        if not found:
            continue
        value = value.strip()
        if key == "hca_id":
            current = RdmaDevice(name=value, port_state=None, link_layer=None)
            devices.append(current)
        elif current is None:
            continue
        elif key == "state" and current.port_state is None:
            current.port_state = value.split()[0] if value else None
        elif key == "link_layer" and current.link_layer is None:
            current.link_layer = value or None
        elif key in ("max_qp", "max_pd", "max_mr"):
            number = re.match(r"\d+", value)
            setattr(current, key, int(number.group()) if number else None)
    return devices


def _gbps(speed: str) -> int | None:
    """``"80 Gb/s"`` -> 80; ``"Up to 120 Gb/s"`` (nothing connected) -> None."""
    match = re.fullmatch(r"(\d+) Gb/s", speed.strip())
    return int(match.group(1)) if match else None


def parse_thunderbolt_links(text: str) -> list[ThunderboltLink]:
    """``system_profiler SPThunderboltDataType -json``: each bus whose cable reaches
    another Mac (an item from ``Apple Inc.``), with the receptacle's current speed."""
    try:
        buses = json.loads(text).get("SPThunderboltDataType", [])
    except (ValueError, AttributeError):
        return []
    links = []
    for bus in buses if isinstance(buses, list) else []:
        macs = [item for item in bus.get("_items", [])
                if isinstance(item, dict) and item.get("vendor_name_key") == "Apple Inc."]
        if not macs:
            continue
        receptacle = next((v for k, v in bus.items()
                           if k.startswith("receptacle_") and isinstance(v, dict)
                           and v.get("receptacle_status_key") == "receptacle_connected"), {})
        links.append(ThunderboltLink(bus=str(bus.get("_name")),
                                     speed_gbps=_gbps(str(receptacle.get("current_speed_key",
                                                                          ""))),
                                     peer=macs[0].get("_name")))
    return links


def rdma_state(sections: dict[str, str]) -> RdmaState | None:
    """The RDMA record from the facts script's sections; None where ``rdma_ctl`` is not
    there (before macOS 26.2: no RDMA at all)."""
    if "rdma_ctl" not in sections:
        return None
    return RdmaState(enabled=parse_rdma_ctl(sections["rdma_ctl"]),
                     devices=parse_ibv_devinfo(sections.get("ibv_devinfo", "")),
                     links=parse_thunderbolt_links(sections.get("thunderbolt", "")))
