"""The inventory's backend: the one answer to "which backend do these hosts run?".

A job names its own (``backend:``); without one, ``mlxops bench``, ``mlxops check``, the
selftest and the bench's all-reduce job ask the selected hosts. The rule:

- every host's ``mlxops_backend``, a host that sets none counting as the default (ring);
- the hosts must agree: anything else is bad input naming each host and its backend.

A host that sets none is ring, not "whatever the others say": provision checked it for
ring only (the ``macos`` task warns about a Thunderbolt Bridge that holds jaccl's ports
only on hosts that name a jaccl backend), so running jaccl on it would be untested.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mlxops.errors import bad_input
from mlxops.node.protocol import DEFAULT_BACKEND

VARIABLE = "mlxops_backend"


def host_backend(host: Any) -> str:
    """The backend one host runs: its ``mlxops_backend``, else the default."""
    return host.var(VARIABLE) or DEFAULT_BACKEND


def hosts_backend(hosts: Sequence[Any], source: object) -> str:
    """The backend every one of ``hosts`` runs; ``source`` (the inventory's path) is where
    the error points when they disagree."""
    named = {h.name: host_backend(h) for h in hosts}
    if len(set(named.values())) > 1:
        listing = ", ".join(f"{h.name} {named[h.name]}{'' if h.is_set(VARIABLE) else ' (unset)'}"
                            for h in hosts)
        raise bad_input(source, VARIABLE,
                        f"the selected hosts name different backends ({listing}): set the "
                        "same on each, --limit to hosts of one, or give a job its own")
    return next(iter(named.values()), DEFAULT_BACKEND)
