"""What the user named or picked, as hosts init will try: ``user@host``, a name, an
address, or an ``~/.ssh/config`` alias (left to ssh's config as every mlxops host is),
and how each is named in the inventory once its facts are known."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from mlxops.errors import UserError

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class Candidate:
    """A host to try: how to reach it, and the name to fall back on."""

    address: str          # ansible_host: a name, an address or an ssh_config alias
    user: str | None      # from ``user@host``
    label: str            # the mDNS instance name, or the address as typed


def parse_spec(spec: str) -> Candidate:
    """``[user@]host``; anything else is bad input (exit 2) naming the argument."""
    user, _, host = spec.rpartition("@")
    if not _NAME.match(host) or (user and not re.match(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$", user)):
        raise UserError(f"init: HOST {spec!r}: expected [user@]host (a name, an IPv4 address "
                        "or an ~/.ssh/config alias)")
    return Candidate(host, user or None, host)


def is_address(text: str) -> bool:
    return bool(re.match(r"^\d+\.\d+\.\d+\.\d+$", text))


def inventory_name(hostname: str | None, label: str, taken: Iterable[str]) -> str:
    """What the user calls the host: ``label`` when it is a name (the mDNS instance name,
    the name or ssh alias typed); for an address, the host's own short name
    (``Studio-1.local`` -> ``studio-1``) when no other host has taken it. Else ``label``
    made valid and unique (``10.0.0.2``, ``10.0.0.2-2``)."""
    taken = set(taken)
    short = re.sub(r"[^a-z0-9_-]", "-", (hostname or "").split(".")[0].lower()).strip("-")
    if is_address(label) and short and short not in taken and short != "localhost":
        return short
    base = re.sub(r"[^A-Za-z0-9_.-]", "-", label).strip("-") or "mac"
    name, n = base, 2
    while name in taken:
        name, n = f"{base}-{n}", n + 1
    return name
