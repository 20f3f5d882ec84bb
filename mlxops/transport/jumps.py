"""Jump hosts: the ProxyJump hops on the way to a host, in OpenSSH's order, each verified.

Fabric reads ``ProxyJump`` from ~/.ssh/config and opens each hop with a client of its own
that accepts any host key (paramiko's AutoAddPolicy), and it chains several hops the wrong
way round (``ProxyJump a,b`` reaches ``a`` through ``b``; OpenSSH visits ``a``, then ``b``:
fabric/fabric#2203). So mlxops never lets Fabric pick a gateway (every Fabric connection is
made with ``gateway=False``); it builds the chain itself and hands paramiko the finished
channel (``connect_kwargs["sock"]``):

- ``ProxyJump a,b``: ``a`` is reached with its own ssh_config (its own ProxyJump or
  ProxyCommand included, as OpenSSH does), ``b`` through ``a``, the host through ``b``.
  ``ProxyJump none`` is no jump. A chain that would pass through the host itself, or go
  round in a loop (a ``Host *`` block that matches the bastion too), stops there: that
  connection is direct, as in Fabric.
- A hop is opened like every host (:func:`mlxops.transport.hostkeys.open_verified`): its
  key is looked up in the known_hosts of the host it leads to (``mlxops_known_hosts`` or
  ``~/.ssh/known_hosts``), an unknown key is refused with its fingerprint unless
  ``--accept-new-host-keys`` (then recorded there), a changed one always; the error says
  ``jump host``.
- One connection per hop for the whole run, shared by every host behind it: one login to
  the bastion, not one per Mac (sshd's default ``MaxStartups 10:30:100`` starts dropping
  connections when more than 10 log in at once).
- ``ProxyCommand`` (when no ProxyJump applies) is run as Fabric runs it (paramiko's
  ``ProxyCommand``, no shell). The host's key is verified through it as through any socket;
  whatever the command itself connects through (``ssh -W %h:%p bastion``) is checked by that
  command under its own settings, not by mlxops, and ``mlxops trust`` says so.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import fabric
import paramiko

from mlxops.errors import MlxopsError
from mlxops.transport.hostkeys import (
    ConnectOptions,
    HostUnreachable,
    KnownHosts,
    lookup_name,
    open_verified,
    scan_host_key,
)

ROLE = "jump host "  # how errors name a hop: "unknown host key for jump host 10.0.0.2 (...)"


def proxy_jumps(ssh_config: Mapping[str, Any]) -> list[str]:
    """The hops of an ssh_config ``ProxyJump``, first hop first (``[]``: none, or ``none``).

    Each hop as OpenSSH writes it, ``[user@]host[:port]`` (an ``ssh://`` URI loses its
    scheme).
    """
    value = str(ssh_config.get("proxyjump") or "").strip()
    if not value or value.lower() == "none":
        return []
    return [hop.strip().removeprefix("ssh://") for hop in value.split(",") if hop.strip()]


class FabricSettings:
    """The run's Fabric settings, read with its first SSH host (~/.ssh/config and
    /etc/ssh/ssh_config, Fabric's own config files), and a private copy of them for every
    connection.

    Why a copy: a Fabric connection writes to its config as it is made (``inline_ssh_env``
    is no attribute of its class, so invoke stores it as a config change), and invoke
    applies any change by rebuilding the whole config from ``{}`` (``Config.merge``). With
    one config shared by the run, a host connecting in another thread meanwhile read an
    empty config (``KeyError: 'authentication'`` in ``Connection.open``, or ``'user'``,
    ``'port'`` while being made). Each connection's own copy is written only by itself;
    the shared one is only read.

    The template is itself a clone: a clone holds the parsed ssh_config as an explicit
    object, so cloning it again reads no file. Cloning a config that read the files itself
    parses them again into it (Fabric's ``Config.clone``), one more copy of every rule
    (and every ``IdentityFile``) per host; here that happens once, to the config made only
    to be cloned.
    """

    def __init__(self, config: fabric.Config | None = None):
        self._template = (config if config is not None else fabric.Config()).clone()
        self._lock = threading.Lock()

    def copy(self) -> fabric.Config:
        """A config of one connection's own, equal to the run's."""
        with self._lock:
            return self._template.clone()


def fabric_connection(settings: FabricSettings, host: str, *, timeout: float,
                      user: str | None = None, port: int | None = None,
                      key_file: Path | None = None) -> fabric.Connection:
    """A Fabric connection as mlxops makes every one: no gateway of Fabric's choosing,
    ``connect_kwargs`` of its own, and a config of its own (:class:`FabricSettings`).

    Given no ``connect_kwargs``, Fabric writes a host's ssh_config ``IdentityFile`` into the
    shared config's, and every connection made after it offers that key too, before its
    own (with a key per Mac in ~/.ssh/config, the seventh Mac would offer six wrong keys
    first and be cut off by sshd's default ``MaxAuthTries 6``).
    """
    keys = [str(key_file)] if key_file else []
    conn = fabric.Connection(host, user=user, port=port, config=settings.copy(), gateway=False,
                             connect_timeout=timeout, connect_kwargs={"key_filename": keys})
    conn.connect_kwargs = dict(conn.connect_kwargs)  # the "sock" we add stays this host's
    return conn


class JumpHost:
    """One hop: a verified SSH connection, opened on first use and shared by every host
    behind it, that opens channels onward (``direct-tcpip``, what ``ssh -W`` asks for).

    Errors are raised for the host a caller names (``for_host``: the inventory host the
    channel is for), so each host behind a hop reports why it could not be reached.
    """

    def __init__(self, spec: str, conn: fabric.Connection, upstream: JumpHost | str | None,
                 known: KnownHosts, options: ConnectOptions):
        self.spec = spec  # as ProxyJump names it
        self.upstream = upstream  # the hop before this one, a ProxyCommand, or None: direct
        self.known_hosts = known
        self._conn = conn
        self._options = options
        self._lock = threading.Lock()
        self._scanned: paramiko.PKey | None = None
        if isinstance(upstream, str):
            conn.gateway = upstream  # Fabric runs a ProxyCommand itself

    @property
    def host_key_name(self) -> str:
        """How known_hosts names this hop (after ~/.ssh/config's HostName and Port)."""
        return lookup_name(self._conn.host, self._conn.port)

    @property
    def identity(self) -> tuple[str, ...]:
        """The hop's place: where it is, as whom, the way there and whose keys judge it."""
        upstream = self.upstream.identity if isinstance(self.upstream, JumpHost) else (
            self.upstream or "",)
        return (self._conn.user, self.host_key_name, str(self.known_hosts.path), *upstream)

    def chain(self) -> list[JumpHost]:
        """This hop and the hops before it, the first hop (nearest the controller) first."""
        before = self.upstream.chain() if isinstance(self.upstream, JumpHost) else []
        return [*before, self]

    def channel(self, address: str, port: int, for_host: str) -> paramiko.Channel:
        """A channel through this hop to ``address:port``, opening the hop if it is not.

        A kept connection can be dead without knowing it (a hop that slept): a channel that
        cannot open on a transport gone inactive is worth one fresh connection.
        """
        with self._lock:
            reused = self._conn.is_connected
            transport = self._open_locked(for_host)
        channel = self._onward(transport, address, port, for_host, last_try=not reused)
        if channel is None:
            with self._lock:
                if self._conn.client.get_transport() is transport:
                    self._conn.close()
                transport = self._open_locked(for_host)
            channel = self._onward(transport, address, port, for_host, last_try=True)
        return channel

    def _onward(self, transport: paramiko.Transport, address: str, port: int, for_host: str,
                last_try: bool) -> paramiko.Channel | None:
        """The channel, or None when the transport turned out dead and another try may do."""
        target = lookup_name(address, port)
        try:
            return transport.open_channel("direct-tcpip", (address, port), ("", 0),
                                          timeout=self._options.connect_timeout)
        except paramiko.ChannelException as exc:  # the hop is fine, the way on is not
            raise HostUnreachable(for_host, f"{ROLE}{self.host_key_name} cannot connect to "
                                            f"{target}: {exc.text}") from None
        except (OSError, paramiko.SSHException, EOFError) as exc:
            if transport.is_active() or last_try:
                # Alive but no answer in time (the hop still waits for the host), or dead
                # on a fresh connection: nothing to retry.
                reason = str(exc) or type(exc).__name__
                raise HostUnreachable(for_host, f"through {ROLE}{self.host_key_name} to "
                                                f"{target}: {reason}") from None
            return None

    def scan_host_key(self, for_host: str) -> paramiko.PKey:
        """The key this hop offers, fetched without logging in to it (once per run).

        Reaching it may need the hops before it open, so logged in to and verified.
        """
        with self._lock:
            if self._scanned is None:
                self._scanned = scan_through(self.upstream, self._conn.host, self._conn.port,
                                             for_host, self._options.connect_timeout, ROLE)
            return self._scanned

    def _open_locked(self, for_host: str) -> paramiko.Transport:
        if self._conn.is_connected:
            return self._conn.transport
        sock = None
        if isinstance(self.upstream, JumpHost):
            sock = self.upstream.channel(self._conn.host, self._conn.port, for_host)
        return open_verified(self._conn, for_host, self.known_hosts,
                             self._options.accept_new_host_keys, ROLE, sock=sock)

    def close(self) -> None:
        self._conn.close()


def scan_through(gateway: JumpHost | str | None, address: str, port: int, for_host: str,
                 timeout: float, role: str = "") -> paramiko.PKey:
    """The host key ``address:port`` offers, reached directly, through a jump host or
    through a ProxyCommand; unreachable: :class:`HostUnreachable` for ``for_host``."""
    name = lookup_name(address, port)
    try:
        if isinstance(gateway, JumpHost):
            sock = gateway.channel(address, port, for_host)
        elif gateway:
            sock = paramiko.ProxyCommand(gateway)
        else:
            sock = None
        return scan_host_key(address, port, timeout=timeout, sock=sock)
    except HostUnreachable:
        raise
    except (OSError, paramiko.SSHException, EOFError) as exc:
        reason = str(exc) or type(exc).__name__
        raise HostUnreachable(for_host, f"cannot connect to {role}{name}: {reason}") from None


def expand_tokens(command: str, conn: fabric.Connection) -> str:
    """ProxyCommand's ``%h``, ``%p``, ``%r`` and ``%%`` for ``conn``'s host, port and user
    (the tokens paramiko expands in ~/.ssh/config's)."""
    values = {"h": conn.host, "p": str(conn.port), "r": conn.user, "%": "%"}
    return re.sub(r"%([hpr%])", lambda m: values[m.group(1)], command)


class Jumps:
    """The jump hosts of one run (a :class:`~mlxops.transport.connector.Connector`'s):
    each hop made once, for every host behind it."""

    def __init__(self, settings: FabricSettings, options: ConnectOptions):
        self._settings = settings
        self._options = options
        self._lock = threading.Lock()
        self._hops: dict[tuple[str, ...], JumpHost] = {}

    def gateway(self, conn: fabric.Connection, known: KnownHosts,
                override: Mapping[str, str] | None = None) -> JumpHost | str | None:
        """What the host of ``conn`` is reached through: the last of its jump hosts, its
        ProxyCommand, or None (directly). ``override``: a ``proxyjump`` or ``proxycommand``
        that wins over ~/.ssh/config's (the inventory's ssh arguments, as on ssh's command
        line)."""
        options = dict(conn.ssh_config)
        if override:
            options.pop("proxyjump", None)
            options.pop("proxycommand", None)
            options.update(override)
            if "proxycommand" in options:  # ~/.ssh/config's own are expanded by paramiko
                options["proxycommand"] = expand_tokens(options["proxycommand"], conn)
        return self._gateway(options, (conn.host,), known)

    def _gateway(self, ssh_config: Mapping[str, Any], path: tuple[str, ...],
                 known: KnownHosts) -> JumpHost | str | None:
        hops = proxy_jumps(ssh_config)
        if not hops:
            command = ssh_config.get("proxycommand")
            return command if command and command.lower() != "none" else None
        timeout = self._options.connect_timeout
        try:
            conns = [fabric_connection(self._settings, spec, timeout=timeout) for spec in hops]
        except ValueError as exc:  # ~/.ssh/config's (the inventory's were checked at load)
            raise MlxopsError(f"ssh_config: ProxyJump {ssh_config['proxyjump']!r}: want "
                              f"[user@]host[:port] hops ({exc})") from None
        if any(c.host in path for c in conns):
            return None  # through itself (a Host pattern matching the hop): go directly
        # The first hop is reached as ssh would reach it on its own: its ssh_config applies.
        upstream = self._gateway(conns[0].ssh_config, path + tuple(c.host for c in conns),
                                 known)
        for spec, conn in zip(hops, conns, strict=True):
            upstream = self._hop(JumpHost(spec, conn, upstream, known, self._options))
        return upstream

    def _hop(self, hop: JumpHost) -> JumpHost:
        with self._lock:
            return self._hops.setdefault(hop.identity, hop)

    def close(self) -> None:
        with self._lock:
            hops, self._hops = list(self._hops.values()), {}
        for hop in reversed(hops):  # the hops furthest from us first
            hop.close()
