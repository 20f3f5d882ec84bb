"""Host-key verification: known_hosts parsed once per run, unknown and changed keys refused.

Fabric's Connection accepts any host key by default (it installs paramiko's AutoAddPolicy,
on its ProxyJump hops too). mlxops never does: every SSH connection, to a host or to a jump
host on the way to one, is opened by :func:`open_verified`, with the keys known for its one
host from a :class:`KnownHosts` store that was parsed once for the whole run, and a
:class:`HostKeyPolicy` that refuses an unknown key (showing its fingerprint) unless the
user said ``--accept-new-host-keys``. A *changed* key is always refused (paramiko raises
BadHostKeyException when the offered key differs from a known one).
"""

from __future__ import annotations

import base64
import hashlib
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where a key is read or a connection opened: see .connection
    import fabric
    import paramiko

DEFAULT_KNOWN_HOSTS = Path("~/.ssh/known_hosts")
SYSTEM_KNOWN_HOSTS = Path("/etc/ssh/ssh_known_hosts")


@dataclass(frozen=True)
class ConnectOptions:
    accept_new_host_keys: bool = False
    connect_timeout: float = 10.0


class HostUnreachable(Exception):
    """A host could not be reached, authenticated or trusted; it counts as unreachable."""

    def __init__(self, host: str, reason: str):
        super().__init__(f"{host}: {reason}")
        self.host = host
        self.reason = reason


class UnknownHostKey(HostUnreachable):
    """``role``: what the key belongs to when it is not the host itself (``"jump host "``)."""

    def __init__(self, host: str, name: str, key: paramiko.PKey, known_hosts: Path,
                 role: str = ""):
        super().__init__(
            host,
            f"unknown host key for {role}{name} ({key.get_name()} {fingerprint(key)}) not in "
            f"{known_hosts}; check it, then run 'mlxops trust' or pass --accept-new-host-keys",
        )
        self.name = name
        self.fingerprint = fingerprint(key)


class ChangedHostKey(HostUnreachable):
    def __init__(self, host: str, name: str, got: paramiko.PKey, expected: paramiko.PKey,
                 known_hosts: Path, role: str = ""):
        super().__init__(
            host,
            f"HOST KEY CHANGED for {role}{name}: offered {got.get_name()} {fingerprint(got)}, "
            f"known {fingerprint(expected)} in {known_hosts}; refusing to connect "
            "(remove the old line only if you know why it changed)",
        )
        self.name = name
        self.key = got
        self.fingerprint = fingerprint(got)


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's SHA256 fingerprint: ``SHA256:`` + unpadded base64 of the key blob's digest."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def lookup_name(address: str, port: int) -> str:
    """The name known_hosts files use: ``host`` on port 22, ``[host]:port`` otherwise."""
    return address if port == 22 else f"[{address}]:{port}"


class KnownHosts:
    """One known_hosts file (plus the read-only system file), parsed once.

    Thread-safe: the executor's workers look keys up and record new ones concurrently.
    """

    def __init__(self, path: Path, system_path: Path | None = SYSTEM_KNOWN_HOSTS):
        import paramiko

        self.path = Path(os.path.expanduser(path))
        self._lock = threading.Lock()
        self._keys = paramiko.HostKeys()
        for source in (system_path, self.path):
            if source is not None and source.is_file():
                self._keys.load(str(source))

    def keys_for(self, name: str) -> dict[str, paramiko.PKey]:
        with self._lock:
            entry = self._keys.lookup(name)
            return dict(entry) if entry else {}

    def record(self, name: str, key: paramiko.PKey) -> None:
        """Remember ``key`` for ``name`` and append it to the file (created 600 if absent)."""
        with self._lock:
            self._keys.add(name, key.get_name(), key)
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            with os.fdopen(fd, "a") as out:
                out.write(f"{name} {key.get_name()} {key.get_base64()}\n")


class HostKeyPolicy:
    """Called by paramiko only for a host with no known key: refuse, or record when allowed.

    A paramiko ``MissingHostKeyPolicy`` by its one method (paramiko only calls
    ``missing_host_key``), not by subclassing: this module is imported long before any
    connection, paramiko only by the first one."""

    def __init__(self, host: str, known: KnownHosts, accept_new: bool, role: str = ""):
        self.host = host
        self.known = known
        self.accept_new = accept_new
        self.role = role

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str,
                         key: paramiko.PKey) -> None:
        if not self.accept_new:
            raise UnknownHostKey(self.host, hostname, key, self.known.path, self.role)
        self.known.record(hostname, key)


class KnownHostsCache:
    """known_hosts stores by path, so that each file is parsed once per run."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stores: dict[Path, KnownHosts] = {}

    def get(self, path: str | Path | None) -> KnownHosts:
        resolved = Path(os.path.expanduser(path or DEFAULT_KNOWN_HOSTS)).absolute()
        with self._lock:
            if resolved not in self._stores:
                self._stores[resolved] = KnownHosts(resolved)
            return self._stores[resolved]


def open_verified(conn: fabric.Connection, host: str, known: KnownHosts, accept_new: bool,
                  role: str = "", sock: paramiko.Channel | None = None) -> paramiko.Transport:
    """Open ``conn`` with its host key verified against ``known``: how every SSH connection
    (a host's, a jump host's) is opened.

    The client is seeded with this host's known keys only: paramiko then negotiates the
    known key type and raises BadHostKeyException on a mismatch by itself; a host it knows
    no key for goes to :class:`HostKeyPolicy`. ``sock``: a channel through a jump host to
    talk SSH over (Fabric hands its ``connect_kwargs`` to ``SSHClient.connect``). Errors are
    ``host``'s (the inventory host the connection is for) and name ``role`` (``"jump host
    "``) and the known_hosts name of what refused.
    """
    import paramiko

    client = conn.client
    name = lookup_name(conn.host, conn.port)
    for keytype, key in known.keys_for(name).items():
        client.get_host_keys().add(name, keytype, key)
    client.set_missing_host_key_policy(HostKeyPolicy(host, known, accept_new, role))
    if sock is not None:
        conn.connect_kwargs["sock"] = sock
    try:
        _open(conn)
    except HostUnreachable:
        raise
    except paramiko.BadHostKeyException as exc:
        raise ChangedHostKey(host, name, exc.key, exc.expected_key, known.path, role) from None
    except paramiko.AuthenticationException as exc:
        raise HostUnreachable(
            host, f"authentication failed for {role}{conn.user}@{name}: {exc}") from None
    except (OSError, paramiko.SSHException, EOFError) as exc:
        reason = str(exc) or type(exc).__name__
        raise HostUnreachable(host, f"cannot connect to {role}{name}: {reason}") from None
    finally:
        conn.connect_kwargs.pop("sock", None)  # a channel serves one connection only
    return client.get_transport()


def _open(conn: fabric.Connection) -> None:
    try:
        conn.open()
    except BaseException:
        conn.client.close()  # a refused key leaves paramiko's transport (and thread) running
        raise


def scan_host_key(address: str, port: int, timeout: float = 10.0,
                  sock: paramiko.Channel | paramiko.ProxyCommand | None = None) -> paramiko.PKey:
    """Fetch a server's host key without authenticating (what ``ssh-keyscan`` does), over
    ``sock`` (a channel through a jump host, a ProxyCommand) when given."""
    import socket

    import paramiko

    if sock is None:
        sock = socket.create_connection((address, port), timeout=timeout)
    transport = paramiko.Transport(sock)
    try:
        transport.banner_timeout = timeout
        transport.start_client(timeout=timeout)
        return transport.get_remote_server_key()
    finally:
        transport.close()
