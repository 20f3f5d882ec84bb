"""Host-key verification: known_hosts parsed once per run, unknown and changed keys refused.

Fabric's Connection accepts any host key by default (it installs paramiko's AutoAddPolicy).
mlxops never does: every SSH connection gets the keys known for its one host from a
:class:`KnownHosts` store that was parsed once for the whole run, and a
:class:`HostKeyPolicy` that refuses an unknown key (showing its fingerprint) unless the
user said ``--accept-new-host-keys``. A *changed* key is always refused (paramiko raises
BadHostKeyException when the offered key differs from a known one).
"""

from __future__ import annotations

import base64
import hashlib
import os
import threading
from pathlib import Path

import paramiko

DEFAULT_KNOWN_HOSTS = Path("~/.ssh/known_hosts")
SYSTEM_KNOWN_HOSTS = Path("/etc/ssh/ssh_known_hosts")


class HostUnreachable(Exception):
    """A host could not be reached, authenticated or trusted; it counts as unreachable."""

    def __init__(self, host: str, reason: str):
        super().__init__(f"{host}: {reason}")
        self.host = host
        self.reason = reason


class UnknownHostKey(HostUnreachable):
    def __init__(self, host: str, name: str, key: paramiko.PKey, known_hosts: Path):
        super().__init__(
            host,
            f"unknown host key for {name} ({key.get_name()} {fingerprint(key)}) not in "
            f"{known_hosts}; check it, then run 'mlxops trust' or pass --accept-new-host-keys",
        )
        self.fingerprint = fingerprint(key)


class ChangedHostKey(HostUnreachable):
    def __init__(self, host: str, name: str, got: paramiko.PKey, expected: paramiko.PKey,
                 known_hosts: Path):
        super().__init__(
            host,
            f"HOST KEY CHANGED for {name}: offered {got.get_name()} {fingerprint(got)}, "
            f"known {fingerprint(expected)} in {known_hosts}; refusing to connect "
            "(remove the old line only if you know why it changed)",
        )
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


class HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Called by paramiko only for a host with no known key: refuse, or record when allowed."""

    def __init__(self, host: str, known: KnownHosts, accept_new: bool):
        self.host = host
        self.known = known
        self.accept_new = accept_new

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str,
                         key: paramiko.PKey) -> None:
        if not self.accept_new:
            raise UnknownHostKey(self.host, hostname, key, self.known.path)
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


def scan_host_key(address: str, port: int, timeout: float = 10.0) -> paramiko.PKey:
    """Fetch a server's host key without authenticating (what ``ssh-keyscan`` does)."""
    import socket

    sock = socket.create_connection((address, port), timeout=timeout)
    transport = paramiko.Transport(sock)
    try:
        transport.banner_timeout = timeout
        transport.start_client(timeout=timeout)
        return transport.get_remote_server_key()
    finally:
        transport.close()
