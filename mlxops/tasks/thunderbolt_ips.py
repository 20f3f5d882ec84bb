"""The ``thunderbolt_ips`` task: Thunderbolt ports get their data addresses, persistently.

Opt-in: only a Mac whose inventory sets ``mlxops_thunderbolt_ips`` (``{device:
"IP/prefix"}``, e.g. ``{en2: 10.0.0.1/30}``: one small subnet per cable). An address set
with ``ifconfig`` is lost when configd rewrites the interface; ``networksetup``'s is kept
in the system configuration. So for each device:

1. the device must be a Thunderbolt port (``networksetup -listallhardwareports``, in the
   facts); else the task fails naming the ports there are;
2. a network service of its own, ``mlxops <device>`` (macOS makes none per Thunderbolt
   port, only the Thunderbolt Bridge): ``networksetup -createnetworkservice`` when
   ``networksetup -getinfo`` does not know it;
3. the address: ``networksetup -setmanual <service> <ip> <mask>`` when ``-getinfo`` shows
   another (no router: the cable is a subnet of its own).

The reads (``networksetup -getinfo``, one per device) go along with the facts command;
:func:`steps_for` is pure. ``--check`` reports what would change; ``--diff`` shows each
service's address before and after. Both changes need root (``ansible_become``). A port
the Thunderbolt Bridge still holds gets a warning (jaccl and the ring need it out).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mlxops import shell
from mlxops.hostfacts import HostFacts
from mlxops.tasks.base import Outcome, TaskContext, task
from mlxops.transport.results import SKIPPED

VAR = "mlxops_thunderbolt_ips"
NOT_ASKED = f"not asked for ({VAR})"


def service(device: str) -> str:
    return f"mlxops {device}"


def parse_getinfo(text: str | None) -> tuple[str, str] | None:
    """``networksetup -getinfo``: ``(ip, subnet mask)`` of a manual configuration; None
    when the service has no manual IPv4 address (or does not exist)."""
    if not text or "Manual Configuration" not in text:
        return None
    values = {}
    for line in text.splitlines():
        key, found, value = line.partition(":")
        if found:
            values[key.strip()] = value.strip()
    ip, mask = values.get("IP address"), values.get("Subnet mask")
    return (ip, mask) if ip and mask else None


@dataclass
class Steps:
    commands: list[list[str]] = field(default_factory=list)
    changes: list[str] = field(default_factory=list)
    diff: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    error: str | None = None


def steps_for(facts: HostFacts, wanted: Mapping[str, str],
              infos: Mapping[str, str | None]) -> Steps:
    """The commands that give each device of ``wanted`` (``{device: "ip/prefix"}``) its
    address; ``infos``: ``networksetup -getinfo`` of each device's service (None: no such
    service)."""
    out = Steps()
    ports = facts.macos.hardware_ports if facts.macos else {}
    members = set(facts.macos.bridge_members) if facts.macos else set()
    thunderbolt = sorted(d for d, p in ports.items()
                         if p.startswith("Thunderbolt") and p != "Thunderbolt Bridge")
    for device, cidr in wanted.items():
        port = ports.get(device)
        if device not in thunderbolt:
            out.error = (f"{device} is not a Thunderbolt port ({port or 'no such port'}); "
                         f"the Thunderbolt ports: {', '.join(thunderbolt) or 'none'}")
            return out
        iface = ipaddress.ip_interface(cidr)
        ip, mask = str(iface.ip), str(iface.netmask)
        name = service(device)
        info = infos.get(device)
        have = parse_getinfo(info)
        if info is None or "Error" in info:
            out.commands.append(["networksetup", "-createnetworkservice", name, port])
            out.changes.append(f"service {name!r} on {port}")
        if have != (ip, mask):
            out.commands.append(["networksetup", "-setmanual", name, ip, mask])
            out.changes.append(f"{device} {ip}/{iface.network.prefixlen}")
            before = f"{have[0]} {have[1]}" if have else "(none)"
            out.diff += [f"--- {name}", f"+++ {name}", f"-{before}", f"+{ip} {mask}"]
        if device in members:
            out.warnings.append(f"{device} is held by the Thunderbolt Bridge: turn it off "
                                "(networksetup -setnetworkserviceenabled 'Thunderbolt "
                                "Bridge' off)")
    return out


def reads(host: Any, args: Mapping[str, Any]) -> dict[str, str]:
    return {device: shell.join(["networksetup", "-getinfo", service(device)])
            for device in host.var(VAR) or {}}


@task("thunderbolt_ips", read=reads)
def thunderbolt_ips_task(ctx: TaskContext, args: Mapping[str, Any]) -> Outcome:
    wanted = ctx.host.var(VAR)
    if not wanted:
        return Outcome.skipped(NOT_ASKED)
    if ctx.facts is None or not ctx.facts.is_darwin:
        return Outcome.skipped(f"not macOS ({ctx.facts.system if ctx.facts else None})")
    infos = {}
    for device in wanted:
        answer = ctx.reads.get(device)
        if answer is None:   # not read with the facts: read now
            result = ctx.conn.run(reads(ctx.host, args)[device], timeout=30)
            infos[device] = result.stdout if result.ok else None
        else:
            infos[device] = answer.stdout if answer.exit_code == 0 else None
    steps = steps_for(ctx.facts, wanted, infos)
    data = {"warnings": steps.warnings} if steps.warnings else {}
    if steps.error:
        return Outcome.failed(steps.error, **data)
    if not steps.commands:
        return Outcome.ok("addressed", **data)
    what = "; ".join(steps.changes)
    diff = "\n".join(steps.diff) + "\n" if ctx.diff and steps.diff else ""
    if not ctx.host.become:
        return Outcome(status=SKIPPED, message=f"needs ansible_become to set: {what}",
                       data=data)
    if ctx.check:
        return Outcome.changed(f"would set {what}", diff=diff, **data)
    commands = [shell.privileged(argv) for argv in steps.commands]
    result = ctx.conn.run(shell.and_then(shell.join(argv) for argv in commands), timeout=60)
    if not result.ok:
        return Outcome.failed(f"{what}: {result.error_line()}", **data)
    return Outcome.changed(f"set {what}", diff=diff, **data)
