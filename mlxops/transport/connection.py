"""Connections to hosts: SSH through Fabric/paramiko, or local for ``ansible_connection: local``.

Both kinds expose the same small surface — :meth:`run` a command line (built by
:mod:`mlxops.shell`), optionally feeding bytes to its stdin — so tasks and jobs never care
which one they hold. Commands are POSIX ``sh``, and run by ``/bin/sh`` on every host: locally
directly, over SSH through :func:`mlxops.shell.posix_sh` (sshd would hand them to the user's
login shell, zsh on a Mac).

SSH commands run on a raw paramiko channel of the Fabric connection rather than through
Fabric's ``run``: invoke's runner decodes stdin as text (our sync archives are binary) and
polls with sleeps, which costs milliseconds per command on every host.
Reading a large output as a stream (either kind): :mod:`.output`.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import threading
import time
from typing import IO, TYPE_CHECKING, Any, Protocol

from mlxops import shell
from mlxops.transport.hostkeys import (
    ConnectOptions,
    HostUnreachable,
    KnownHosts,
    lookup_name,
    open_verified,
)
from mlxops.transport.results import CommandResult
from mlxops.transport.streams import LineStream, LocalLineStream, SSHLineStream

if TYPE_CHECKING:
    # Fabric and paramiko (and .jumps, built on them) are imported by the first SSH
    # connection, not here: they cost a third of a second, and every command imports this
    # module, most of them long before they connect (``--help``, bad input, ``status``
    # with no jobs). tests/unit/cli/test_startup.py holds that.
    import fabric
    import paramiko

    from mlxops.transport.jumps import JumpHost

Stdin = bytes | IO[bytes] | None

TIMED_OUT = 124  # the exit code coreutils' timeout(1) uses; set when we give up on a command


class Connection(Protocol):
    name: str

    def run(self, command: str, *, timeout: float | None = None,
            stdin: Stdin = None) -> CommandResult: ...

    def stream(self, command: str) -> LineStream: ...

    def close(self) -> None: ...

    def open_tunnel(self, address: str, port: int, timeout: float = 10.0) -> Any: ...


def _chunks(stdin: Stdin, size: int = 1 << 16):
    if stdin is None:
        return
    if isinstance(stdin, bytes):
        for i in range(0, len(stdin), size):
            yield stdin[i:i + size]
        return
    while chunk := stdin.read(size):
        yield chunk


class LocalConnection:
    """This machine, for hosts with ``ansible_connection: local`` (no SSH)."""

    def __init__(self, name: str):
        self.name = name

    def run(self, command: str, *, timeout: float | None = None,
            stdin: Stdin = None) -> CommandResult:
        start = time.monotonic()
        # A stream (a tar made as it is read) is fed from a thread through a pipe of our
        # own, a chunk at a time, never read whole; bytes go through communicate().
        streamed = stdin is not None and not isinstance(stdin, bytes)
        pipe = os.pipe() if streamed else None
        # Own session: on timeout the whole process group goes, not just the shell.
        proc = subprocess.Popen(
            ["/bin/sh", "-c", command], stdin=pipe[0] if pipe else subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
            cwd=os.path.expanduser("~"),
        )
        if pipe:
            os.close(pipe[0])
            threading.Thread(target=_feed_fd, args=(pipe[1], stdin), daemon=True).start()
        try:
            out, err = proc.communicate(None if pipe else (stdin or b""), timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            timed_out = True
        return CommandResult(
            command=command,
            exit_code=TIMED_OUT if timed_out else proc.returncode,
            stdout=out.decode(errors="replace"),
            stderr=err.decode(errors="replace"),
            duration=time.monotonic() - start,
            timed_out=timed_out,
        )

    def stream(self, command: str) -> LineStream:
        proc = subprocess.Popen(["/bin/sh", "-c", command], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                start_new_session=True, cwd=os.path.expanduser("~"))
        return LocalLineStream(proc)

    def close(self) -> None:
        pass

    def open_tunnel(self, address: str, port: int, timeout: float = 10.0) -> socket.socket:
        """A TCP connection to ``address``:``port`` as this host sees it (here: itself)."""
        return socket.create_connection((address, port), timeout=timeout)


class SSHConnection:
    """One SSH host: a Fabric Connection (ssh_config, keys) with verified host keys, reached
    directly, through its jump hosts (ProxyJump, each verified: :mod:`.jumps`) or through a
    ProxyCommand.

    Opened on first use and kept open for the whole run; safe to use from one thread at a
    time (the executor gives each host its own worker).
    """

    def __init__(self, name: str, fabric_conn: fabric.Connection, known_hosts: KnownHosts,
                 options: ConnectOptions, gateway: JumpHost | str | None = None):
        self.name = name
        self._conn = fabric_conn
        self._known_hosts = known_hosts
        self._options = options
        self._gateway = gateway
        if isinstance(gateway, str):
            fabric_conn.gateway = gateway  # Fabric runs a ProxyCommand itself
        self._lock = threading.Lock()

    @property
    def address(self) -> str:
        return self._conn.host

    @property
    def known_hosts(self) -> KnownHosts:
        return self._known_hosts

    @property
    def host_key_name(self) -> str:
        """How known_hosts names this host (after ~/.ssh/config's HostName and Port)."""
        return lookup_name(self._conn.host, self._conn.port)

    @property
    def jump_hosts(self) -> list[JumpHost]:
        """The hops on the way here, the first one (nearest the controller) first."""
        from mlxops.transport.jumps import JumpHost

        return self._gateway.chain() if isinstance(self._gateway, JumpHost) else []

    @property
    def proxy_command(self) -> str | None:
        """The ssh_config ProxyCommand this host is reached through (nothing mlxops verifies
        but the host's own key at the end of it), or None."""
        gateway = self.jump_hosts[0].upstream if self.jump_hosts else self._gateway
        return gateway if isinstance(gateway, str) else None

    def scan_host_key(self) -> paramiko.PKey:
        """The key the server offers, fetched without authenticating (like ssh-keyscan);
        through its jump hosts, which are opened, so verified, for it."""
        from mlxops.transport.jumps import scan_through

        return scan_through(self._gateway, self._conn.host, self._conn.port, self.name,
                            self._options.connect_timeout)

    def open(self) -> paramiko.Transport:
        """Connect now (verified as every connection is), if not connected yet: for a
        caller that wants the server's key from the connection it then keeps using."""
        with self._lock:
            return self._open_locked()

    def _open_locked(self) -> paramiko.Transport:
        from mlxops.transport.jumps import JumpHost

        if self._conn.is_connected:
            return self._conn.client.get_transport()
        sock = None
        if isinstance(self._gateway, JumpHost):
            sock = self._gateway.channel(self._conn.host, self._conn.port, self.name)
        open_verified(self._conn, self.name, self._known_hosts,
                      self._options.accept_new_host_keys, sock=sock)
        return self._conn.client.get_transport()

    def _session(self) -> tuple[paramiko.Transport, paramiko.Channel]:
        """A new session channel, on the kept transport or, if that is dead, a new one.

        A kept transport can be dead without knowing it: a link that went down and came
        back leaves TCP backing off between retransmits for minutes. Failing to open a
        channel on it says nothing about the host (and the command has not started), so
        that is worth one fresh connection before calling the host unreachable.
        """
        import paramiko

        with self._lock:  # channels may be opened from several threads; connect once
            reused = self._conn.is_connected
            transport = self._open_locked()
        try:
            return transport, transport.open_session(timeout=self._options.connect_timeout)
        except (OSError, paramiko.SSHException, EOFError):
            if not reused:
                raise
        with self._lock:
            if self._conn.client.get_transport() is transport:
                self._conn.close()
            transport = self._open_locked()
        return transport, transport.open_session(timeout=self._options.connect_timeout)

    def run(self, command: str, *, timeout: float | None = None,
            stdin: Stdin = None) -> CommandResult:
        import paramiko

        start = time.monotonic()
        # With a timeout, the command first reports its process group on stderr: sshd makes
        # each session's shell a group leader, so `$$` is the group of everything the
        # command starts, and giving up on it can then kill them all (closing the channel
        # alone leaves a command that does not write running on the node).
        wire = _REPORT_PGID + command if timeout is not None else command
        try:
            transport, channel = self._session()
            _exec(channel, wire)
            feeder = None
            if stdin is not None:
                feeder = threading.Thread(target=_feed, args=(channel, stdin), daemon=True)
                feeder.start()
            else:
                channel.shutdown_write()
            out, err, timed_out = _drain(channel, timeout)
            exit_code = TIMED_OUT if timed_out else channel.recv_exit_status()
            channel.close()
            if feeder is not None:
                feeder.join(timeout=1)
            pgid, err = _split_pgid(err) if timeout is not None else (None, err)
            if timed_out and pgid:
                self._kill_group(transport, pgid)
        except (OSError, paramiko.SSHException, EOFError) as exc:
            # Drop the dead transport: the next command (a node back online) reconnects.
            self._conn.close()
            raise HostUnreachable(self.name, f"connection lost: {exc}") from None
        return CommandResult(command, exit_code, out.decode(errors="replace"),
                             err.decode(errors="replace"), time.monotonic() - start, timed_out)

    def stream(self, command: str) -> LineStream:
        """Start ``command`` and read its stdout as it comes (its stdin stays open until
        :meth:`LineStream.close`; its stderr is not read)."""
        import paramiko

        try:
            _, channel = self._session()
            _exec(channel, command)
        except (OSError, paramiko.SSHException, EOFError) as exc:
            self._conn.close()
            raise HostUnreachable(self.name, f"connection lost: {exc}") from None
        return SSHLineStream(self.name, channel)

    def open_tunnel(self, address: str, port: int, timeout: float = 10.0) -> paramiko.Channel:
        """A TCP connection to ``address``:``port`` as the host sees it (``127.0.0.1``: its
        loopback), carried by this host's verified SSH transport (a ``direct-tcpip``
        channel, what ``ssh -L`` opens). Raises :class:`HostUnreachable` when the host
        cannot be reached, ``ConnectionRefusedError`` when nothing listens there."""
        import paramiko

        with self._lock:
            try:
                transport = self._open_locked()
            except (OSError, paramiko.SSHException, EOFError) as exc:
                self._conn.close()
                raise HostUnreachable(self.name, f"connection lost: {exc}") from None
        # Without TCP_NODELAY every channel open waits out Nagle against the peer's delayed
        # ACK: 36-44 ms here, 0.4-2.5 ms with it (each request through a forward opens one).
        if isinstance(transport.sock, socket.socket):
            transport.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            return transport.open_channel("direct-tcpip", (address, port), ("127.0.0.1", 0),
                                          timeout=timeout)
        except paramiko.ChannelException as exc:
            # sshd could not connect on its side (code 2: connect failed).
            raise ConnectionRefusedError(f"{self.name}: {address}:{port}: {exc}") from None
        except (OSError, paramiko.SSHException, EOFError) as exc:
            self._conn.close()
            raise HostUnreachable(self.name, f"connection lost: {exc}") from None

    def _kill_group(self, transport: paramiko.Transport, pgid: int) -> None:
        """TERM, then KILL a second later, the process group of a command we gave up on."""
        group = f"-{pgid}"
        channel = transport.open_session(timeout=self._options.connect_timeout)
        # `kill -SIG -PGID`, not `kill -SIG -- -PGID`: dash (Debian's /bin/sh) reads `--`
        # as a pid; bash, zsh and macOS's sh take both.
        _exec(channel, f"kill -TERM {group} 2>/dev/null; sleep 1; "
                       f"kill -KILL {group} 2>/dev/null; true")
        channel.shutdown_write()
        _drain(channel, 5.0)
        channel.close()

    def close(self) -> None:
        self._conn.close()


def _exec(channel: paramiko.Channel, command: str) -> None:
    """Start ``command`` on the node: the one place an SSH command is sent, always through
    :func:`mlxops.shell.posix_sh`, so the node user's login shell (zsh on a Mac) never
    parses it. A unit test holds that nothing else calls ``exec_command``."""
    channel.exec_command(shell.posix_sh(command))


_REPORT_PGID = "printf 'MLXOPS_PGID=%s\\n' \"$$\" >&2; "


def _split_pgid(err: bytes) -> tuple[int | None, bytes]:
    """The process group the command reported first on stderr, and the rest of stderr."""
    head, sep, rest = err.partition(b"\n")
    if head.startswith(b"MLXOPS_PGID=") and head[12:].isdigit():
        return int(head[12:]), rest
    return None, err


def _feed_fd(fd: int, stdin: Stdin) -> None:
    try:
        with os.fdopen(fd, "wb") as pipe:
            for chunk in _chunks(stdin):
                pipe.write(chunk)
    except (BrokenPipeError, ValueError):
        pass  # the command exited early; its exit status tells what happened


def _feed(channel: paramiko.Channel, stdin: Stdin) -> None:
    import paramiko

    try:
        for chunk in _chunks(stdin):
            channel.sendall(chunk)
        channel.shutdown_write()
    except (OSError, paramiko.SSHException):
        pass  # the command exited early; its exit status tells what happened


def _drain(channel: paramiko.Channel, timeout: float | None) -> tuple[bytes, bytes, bool]:
    """Read stdout and stderr until the command exits (or the timeout passes)."""
    out, err = bytearray(), bytearray()
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        while channel.recv_ready():
            out += channel.recv(1 << 16)
        while channel.recv_stderr_ready():
            err += channel.recv_stderr(1 << 16)
        if channel.exit_status_ready() and not channel.recv_ready() \
                and not channel.recv_stderr_ready():
            if channel.eof_received or channel.closed:
                return bytes(out), bytes(err), False
        wait = 0.5
        if deadline is not None:
            wait = deadline - time.monotonic()
            if wait <= 0:
                channel.close()  # the remote command sees its pipes close (SIGPIPE / EOF)
                return bytes(out), bytes(err), True
            wait = min(wait, 0.5)
        select.select([channel], [], [], wait)
