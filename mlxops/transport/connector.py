"""The run's connections: one per host, made on first use (SSH or local) and kept.

Split from :mod:`mlxops.transport.connection` (the connections themselves): this is where
a run's shared state lives, the parsed known_hosts files, the Fabric settings read from
~/.ssh/config with the first SSH host (each connection gets its own copy of them), the jump
hosts every host behind them shares.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from mlxops.transport.connection import Connection, LocalConnection, SSHConnection
from mlxops.transport.hostkeys import ConnectOptions, KnownHostsCache

if TYPE_CHECKING:
    from mlxops.transport.jumps import FabricSettings, Jumps


class Connector:
    """Connections to hosts: one per host, opened on first use and kept for the run.

    Parsed known_hosts files are shared across hosts. ``close()`` ends every connection.
    """

    def __init__(self, options: ConnectOptions | None = None):
        self.options = options or ConnectOptions()
        self._known_hosts = KnownHostsCache()
        self._lock = threading.Lock()
        self._connections: dict[str, Connection] = {}
        self._fabric: FabricSettings | None = None  # made by the first SSH host
        self._jumps: Jumps | None = None

    def connect(self, host) -> Connection:
        """The connection to ``host`` (an :class:`mlxops.inventory.Host`), made once."""
        with self._lock:
            conn = self._connections.get(host.name)
            if conn is None:
                conn = self._connections[host.name] = self._make(host)
            return conn

    def close(self) -> None:
        with self._lock:
            connections, self._connections = list(self._connections.values()), {}
        for conn in connections:
            conn.close()
        if self._jumps is not None:
            self._jumps.close()  # after the hosts whose channels run through them

    def __enter__(self) -> Connector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _ssh(self) -> tuple[FabricSettings, Jumps]:
        """The run's Fabric settings and its jump hosts, made with the first SSH host
        (under ``self._lock``): ~/.ssh/config is read then, not per host, and a run that
        never connects (``--help``, bad input, ``status`` with no jobs) never imports
        Fabric."""
        if self._jumps is None:
            from mlxops.transport.jumps import FabricSettings, Jumps

            self._fabric = FabricSettings()
            self._jumps = Jumps(self._fabric, self.options)
        return self._fabric, self._jumps

    def _make(self, host) -> Connection:
        if host.connection == "local":
            return LocalConnection(host.name)
        from mlxops.transport.jumps import fabric_connection

        settings, jumps = self._ssh()
        conn = fabric_connection(
            settings, host.address, user=host.user,
            port=host.ssh_port,  # None unless the inventory names one: ~/.ssh/config may
            key_file=host.key_file, timeout=self.options.connect_timeout)
        known = self._known_hosts.get(host.known_hosts)
        return SSHConnection(host.name, conn, known, self.options,
                             jumps.gateway(conn, known, host.ssh_proxy))
