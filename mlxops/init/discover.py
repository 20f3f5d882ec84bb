"""Macs offering SSH on the local network: Bonjour's ``_ssh._tcp`` over mDNS.

macOS advertises ``_ssh._tcp.local.`` while Remote Login is on (one instance per Mac,
named after its computer name). The browsing is python-zeroconf's (a maintained mDNS
implementation, not ours): :func:`discover` listens for ``seconds``, resolves every
instance it heard of to its IPv4 address and port, and returns them sorted by name.
``interfaces``: the local addresses to browse on (default: every interface); a sandbox
test names its bridge's address so that only its own nodes answer.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

SERVICE = "_ssh._tcp.local."


@dataclass(frozen=True, order=True)
class Found:
    """One ``_ssh._tcp`` instance."""

    name: str      # the instance name: the Mac's computer name ("Studio-1")
    address: str   # its first IPv4 address
    port: int
    server: str    # its mDNS host name ("Studio-1.local.")


def discover(seconds: float = 3.0, interfaces: Sequence[str] | None = None) -> list[Found]:
    """Every ``_ssh._tcp`` instance that answered within ``seconds``."""
    from zeroconf import InterfaceChoice, IPVersion, ServiceBrowser, Zeroconf

    zc = Zeroconf(interfaces=list(interfaces) if interfaces else InterfaceChoice.All,
                  ip_version=IPVersion.V4Only)
    names: set[str] = set()
    try:
        browser = ServiceBrowser(zc, SERVICE, handlers=[
            lambda zeroconf, service_type, name, state_change: names.add(name)])
        time.sleep(seconds)  # mDNS has no "done": answers arrive while we listen
        browser.cancel()
        found = []
        for name in sorted(names):
            info = zc.get_service_info(SERVICE, name, timeout=2000)
            if info is None or not info.parsed_addresses():
                continue
            found.append(Found(name[: -len(SERVICE) - 1], info.parsed_addresses()[0],
                               int(info.port or 22), info.server or ""))
        return sorted(found)
    finally:
        zc.close()
