"""A command's output read as a stream, for output too large to hold: a node sending files
(``python -m mlxops.node send``: an answer line, then a tar; :mod:`mlxops.jobs.download`).

:func:`read_output` hands the command's stdout to a ``consume`` function as a
binary file, read as ``consume`` reads it: over SSH, paramiko's window (2 MB) is all that is
ever buffered, so a 15 GB model crosses the controller's memory a buffer at a time. What
``consume`` leaves unread is read and dropped (so the command is not blocked on a full
pipe), then stderr and the exit code are collected into a :class:`CommandResult` whose
``stdout`` is empty.

The policy:

* ``timeout`` is seconds **without a byte** (a transfer of any size runs as long as bytes
  come); past it the command's process group is killed, as :meth:`run` does, and the
  result says ``timed_out``.
* A connection lost while reading is :class:`HostUnreachable`, raised from the read inside
  ``consume``; anything else ``consume`` raises (a damaged tar, a full local disk) is its
  own, raised as it is, after the command is ended.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, TypeVar

from mlxops.transport.connection import (
    _REPORT_PGID,
    TIMED_OUT,
    Connection,
    LocalConnection,
    _exec,
    _split_pgid,
)
from mlxops.transport.hostkeys import HostUnreachable
from mlxops.transport.results import CommandResult

if TYPE_CHECKING:
    import paramiko

    from mlxops.transport.connection import SSHConnection

T = TypeVar("T")
Consume = Callable[[IO[bytes]], T]
_CHUNK = 1 << 16


def read_output(conn: Connection, command: str, consume: Consume[T], *,
                timeout: float | None = None) -> tuple[T, CommandResult]:
    """Run ``command`` on ``conn``; ``consume(its stdout)`` as it comes, never held whole.
    ``(what consume returned, the result)``; ``timeout``: over SSH, seconds without a byte
    (locally, the whole command's)."""
    if isinstance(conn, LocalConnection):
        return read_local(conn, command, consume, timeout)
    return read_ssh(conn, command, consume, timeout)  # type: ignore[arg-type]


class OutputTimedOut(Exception):
    """No byte of the command's output came for ``timeout`` seconds."""


class _ChannelReader(io.RawIOBase):
    """A channel's stdout as a raw file: a lost connection is the host's, a silence past
    the channel's timeout is :class:`OutputTimedOut`."""

    def __init__(self, host: str, channel: paramiko.Channel) -> None:
        self.host, self.channel = host, channel

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:
        import paramiko

        try:
            data = self.channel.recv(len(buffer))
        except TimeoutError:
            raise OutputTimedOut() from None
        except (OSError, paramiko.SSHException, EOFError) as exc:
            raise HostUnreachable(self.host, f"connection lost: {exc}") from None
        buffer[:len(data)] = data
        return len(data)


def _drop_rest(out: IO[bytes]) -> None:
    while out.read(_CHUNK):
        pass


def read_ssh(conn: SSHConnection, command: str, consume: Consume[T],
             timeout: float | None) -> tuple[T, CommandResult]:
    import paramiko

    start = time.monotonic()
    try:
        transport, channel = conn._session()
        _exec(channel, _REPORT_PGID + command)
        channel.shutdown_write()
    except (OSError, paramiko.SSHException, EOFError) as exc:
        conn._conn.close()
        raise HostUnreachable(conn.name, f"connection lost: {exc}") from None
    channel.settimeout(timeout)
    out = io.BufferedReader(_ChannelReader(conn.name, channel), _CHUNK)
    timed_out = False
    try:
        value = consume(out)
        _drop_rest(out)
    except OutputTimedOut:
        timed_out, value = True, None
    except BaseException:
        _end(conn, transport, channel)
        raise
    err = bytearray()
    try:
        while not timed_out:
            chunk = channel.recv_stderr(_CHUNK)
            if not chunk:
                break
            err += chunk
        code = TIMED_OUT if timed_out else channel.recv_exit_status()
    except TimeoutError:
        timed_out, code = True, TIMED_OUT
    except (OSError, paramiko.SSHException, EOFError) as exc:
        conn._conn.close()
        raise HostUnreachable(conn.name, f"connection lost: {exc}") from None
    if timed_out:
        _end(conn, transport, channel)
    channel.close()
    _, rest = _split_pgid(bytes(err))
    return value, CommandResult(command, code, "", rest.decode(errors="replace"),
                                time.monotonic() - start, timed_out)


def _end(conn: SSHConnection, transport: paramiko.Transport,
         channel: paramiko.Channel) -> None:
    """Kill the command's process group (reported first on its stderr), close the channel."""
    while channel.recv_stderr_ready():
        head = channel.recv_stderr(256)
        pgid, _ = _split_pgid(head)
        if pgid:
            try:
                conn._kill_group(transport, pgid)
            except Exception:  # noqa: BLE001 - best effort: closing the channel follows
                pass
        break
    channel.close()


def read_local(conn: LocalConnection, command: str, consume: Consume[T],
               timeout: float | None) -> tuple[T, CommandResult]:
    start = time.monotonic()
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(["/bin/sh", "-c", command], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=err, start_new_session=True,
                                cwd=os.path.expanduser("~"))
        assert proc.stdout is not None
        fired = threading.Event()

        def kill() -> None:
            fired.set()
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

        # Locally the timeout is the whole command's: a pipe has no per-read timeout.
        timer = threading.Timer(timeout, kill) if timeout is not None else None
        if timer is not None:
            timer.daemon = True
            timer.start()
        try:
            value = consume(proc.stdout)
            _drop_rest(proc.stdout)
        except BaseException:
            kill()
            proc.wait()
            raise
        finally:
            if timer is not None:
                timer.cancel()
            proc.stdout.close()
        code = proc.wait()
        err.seek(0)
        stderr = err.read().decode(errors="replace")
    timed_out = fired.is_set()
    return value, CommandResult(command, TIMED_OUT if timed_out else code, "", stderr,
                                time.monotonic() - start, timed_out)
