"""``mlxops trust``: fetch each host's key, compare it with known_hosts, record the new ones.

The same as running ``ssh-keyscan`` and checking fingerprints by hand, for a whole inventory,
jump hosts included: each hop on the way to a host (ProxyJump) is scanned and judged like a
host, against the same known_hosts. A hop further on can only be reached by logging in to
the one before it, so a host behind a hop whose key is not known yet is not scanned
(*blocked*) until that key is recorded; then ``mlxops trust`` goes on to it. A changed key
is never recorded here: that is for a person to investigate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from mlxops.transport import Connector, HostResult, Results, run_parallel
from mlxops.transport.connection import SSHConnection
from mlxops.transport.hostkeys import KnownHosts, fingerprint
from mlxops.transport.results import CHANGED, FAILED, OK, SKIPPED

if TYPE_CHECKING:  # paramiko comes with the first connection (mlxops.transport.connection)
    import paramiko

KNOWN, NEW, KEY_CHANGED, LOCAL, BLOCKED = "known", "new", "changed", "local", "blocked"


@dataclass
class HostKeyCheck:
    host: str  # the inventory name; a jump host's: "jump host <its ProxyJump spec>"
    name: str = ""
    key: paramiko.PKey | None = None
    state: str = ""
    store: KnownHosts | None = None  # the known_hosts file this host's key belongs in
    jumps: list[HostKeyCheck] = field(default_factory=list)  # the hops on the way, in order
    proxy_command: str | None = None  # what mlxops does not verify on the way, if anything

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.key) if self.key is not None else ""

    @property
    def key_type(self) -> str:
        return self.key.get_name() if self.key is not None else ""

    @property
    def identity(self) -> tuple[Path | None, str]:
        """Which key this is: one known_hosts file's name for one server."""
        return (self.store.path if self.store else None, self.name)


def judge(known: KnownHosts, name: str, key: paramiko.PKey) -> str:
    """``known``, ``new`` or ``changed``: ``key`` offered for ``name`` against ``known``."""
    recorded = known.keys_for(name)
    if key.get_name() not in recorded:
        # A host known under another key type but offering a new type is not proof of
        # tampering, yet not proof of identity either: treat it as new.
        return NEW
    return KNOWN if recorded[key.get_name()] == key else KEY_CHANGED


def _scan(host, connector: Connector) -> HostResult:
    """One host's key, and its jump hosts' on the way, scanned and judged."""
    conn = connector.connect(host)
    from mlxops.transport.jumps import ROLE  # Fabric's module: imported by connect()

    if not isinstance(conn, SSHConnection):
        return HostResult(host.name, SKIPPED, "local connection, no host key",
                          value=HostKeyCheck(host.name, state=LOCAL))
    hops = []
    for hop in conn.jump_hosts:  # scanning each one but the first opens the one before
        key = hop.scan_host_key(host.name)
        state = judge(hop.known_hosts, hop.host_key_name, key)
        hops.append(HostKeyCheck(ROLE + hop.spec, hop.host_key_name, key, state,
                                 hop.known_hosts))
        if state != KNOWN:  # nothing behind it is reached before its key is trusted
            return HostResult(host.name, FAILED if state == KEY_CHANGED else SKIPPED,
                              f"behind {ROLE}{hop.spec}, whose key is {state}",
                              value=HostKeyCheck(host.name, conn.host_key_name,
                                                 state=BLOCKED, store=conn.known_hosts,
                                                 jumps=hops))
    key = conn.scan_host_key()
    name = conn.host_key_name
    return _judged(host.name, HostKeyCheck(host.name, name, key, judge(conn.known_hosts, name, key),
                                           conn.known_hosts, hops, conn.proxy_command))


def _judged(host: str, check: HostKeyCheck) -> HostResult:
    status = {KNOWN: OK, NEW: CHANGED, KEY_CHANGED: FAILED}[check.state]
    message = "HOST KEY CHANGED" if check.state == KEY_CHANGED else ""
    return HostResult(host, status, message, value=check)


def check_host_keys(hosts: Sequence, connector: Connector,
                    forks: int | None = None) -> tuple[Results, dict[str, HostKeyCheck]]:
    """Scan every host's key, and its jump hosts' on the way, and judge each one."""
    return _checks(run_parallel(hosts, lambda h: _scan(h, connector), forks=forks))


def _checks(results: Results) -> tuple[Results, dict[str, HostKeyCheck]]:
    # A changed key is a failed result that still carries its check (to show and refuse).
    return results, {h: r.value for h, r in results.items() if r.value is not None}


def open_and_judge(hosts: Sequence, connector: Connector,
                   forks: int | None = None) -> tuple[Results, dict[str, HostKeyCheck]]:
    """:func:`check_host_keys` for a ``connector`` that records new keys itself (consent
    given before the keys are seen: ``--accept-new-host-keys``): :func:`judge_opened` for
    every host, in parallel."""
    return _checks(run_parallel(hosts, lambda h: judge_opened(h, connector), forks=forks))


def judge_opened(host, connector: Connector) -> HostResult:
    """One host's key, judged from its own connection: opened, verified against
    known_hosts, and its key judged from it, so the connection that said the key is the
    one the caller goes on using (one SSH handshake a host instead of a scan and then a
    login). A new key is recorded by the connection
    (:class:`~mlxops.transport.hostkeys.HostKeyPolicy`): :func:`record_new_keys` then
    finds it there and skips it. A changed key is refused as ever. A host behind a jump
    host or a ProxyCommand is scanned as :func:`check_host_keys` does (its hops are judged
    on the way, and their new keys left to :func:`record_new_keys`). What known_hosts held
    is read for this host just before its own connection opens, so hosts judged at
    different times (``mlxops init`` opens each as its mDNS answer comes) are each judged
    against the file as it was before their own key went in."""
    from mlxops.transport.hostkeys import ChangedHostKey, HostUnreachable

    conn = connector.connect(host)
    if not isinstance(conn, SSHConnection) or conn.jump_hosts or conn.proxy_command:
        return _scan(host, connector)
    name, store = conn.host_key_name, conn.known_hosts
    before = store.keys_for(name)  # what was known before the connection records
    try:
        key = conn.open().get_remote_server_key()
    except ChangedHostKey as exc:
        return _judged(host.name, HostKeyCheck(host.name, name, exc.key, KEY_CHANGED, store))
    except HostUnreachable:
        recorded = {t: k for t, k in store.keys_for(name).items() if t not in before}
        if not recorded:  # not even the key exchange: unreachable, no key to show
            raise
        # The key was recorded, then the login failed: shown as new, and the caller's
        # next use of the connection says why it fails.
        key = next(iter(recorded.values()))
    state = KNOWN if before.get(key.get_name()) == key else NEW
    return _judged(host.name, HostKeyCheck(host.name, name, key, state, store))


def every_check(checks: dict[str, HostKeyCheck]) -> list[HostKeyCheck]:
    """Each key once: the hosts' and their jump hosts', jump hosts first (a hop shared by
    several hosts, or that is an inventory host too, is one key)."""
    seen, ordered = set(), []
    hosts = [c for c in checks.values() if c.state != BLOCKED]
    for check in [hop for c in checks.values() for hop in c.jumps] + hosts:
        if check.key is not None and check.identity in seen:
            continue
        seen.add(check.identity)
        ordered.append(check)
    return ordered


def record_new_keys(checks: dict[str, HostKeyCheck]) -> list[str]:
    """Append every new key (jump hosts' too) to its known_hosts file, each key once;
    returns what was recorded (host names, ``jump host <spec>``). A key the file holds
    already (recorded by a connection that accepted it, :func:`open_and_judge`) is not
    written again."""
    recorded = []
    for check in every_check(checks):
        if check.state == NEW and check.key is not None and check.store is not None:
            if check.store.keys_for(check.name).get(check.key.get_name()) == check.key:
                continue
            check.store.record(check.name, check.key)
            recorded.append(check.host)
    return recorded
