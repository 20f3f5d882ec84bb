"""``mlxops trust``: fetch each host's key, compare it with known_hosts, record the new ones.

The same as running ``ssh-keyscan`` and checking fingerprints by hand, for a whole inventory.
A changed key is never recorded here: that is for a person to investigate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import paramiko

from mlxops.transport import Connector, HostResult, Results, run_parallel
from mlxops.transport.connection import SSHConnection
from mlxops.transport.hostkeys import KnownHosts, fingerprint
from mlxops.transport.results import CHANGED, FAILED, OK, SKIPPED

KNOWN, NEW, KEY_CHANGED, LOCAL = "known", "new", "changed", "local"


@dataclass
class HostKeyCheck:
    host: str
    name: str = ""
    key: paramiko.PKey | None = None
    state: str = ""
    store: KnownHosts | None = None  # the known_hosts file this host's key belongs in

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.key) if self.key is not None else ""

    @property
    def key_type(self) -> str:
        return self.key.get_name() if self.key is not None else ""


def check_host_keys(hosts: Sequence, connector: Connector,
                    forks: int | None = None) -> tuple[Results, dict[str, HostKeyCheck]]:
    """Scan every host's key and classify it as known, new or changed."""

    def work(host) -> HostResult:
        conn = connector.connect(host)
        if not isinstance(conn, SSHConnection):
            return HostResult(host.name, SKIPPED, "local connection, no host key",
                              value=HostKeyCheck(host.name, state=LOCAL))
        key = conn.scan_host_key()
        name = conn.host_key_name
        known = conn.known_hosts.keys_for(name)
        if key.get_name() in known:
            state = KNOWN if known[key.get_name()] == key else KEY_CHANGED
        else:
            # A host known under another key type but offering a new type is not proof of
            # tampering, yet not proof of identity either: treat it as new.
            state = NEW
        status = {KNOWN: OK, NEW: CHANGED, KEY_CHANGED: FAILED}[state]
        message = "HOST KEY CHANGED" if state == KEY_CHANGED else ""
        return HostResult(host.name, status, message,
                          value=HostKeyCheck(host.name, name, key, state, conn.known_hosts))

    results = run_parallel(hosts, work, forks=forks)
    # A changed key is a failed result that still carries its check (to show and refuse).
    checks = {h: r.value for h, r in results.items() if r.value is not None}
    return results, checks


def record_new_keys(checks: dict[str, HostKeyCheck]) -> list[str]:
    """Append every new key to its known_hosts file; returns the hosts recorded."""
    recorded = []
    for host, check in checks.items():
        if check.state == NEW and check.key is not None and check.store is not None:
            check.store.record(check.name, check.key)
            recorded.append(host)
    return recorded
