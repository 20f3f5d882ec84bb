"""A long-lived command's stdout, line by line as it comes: what ``Connection.stream``
returns, over SSH (a paramiko channel) or locally (a subprocess).

Used for the watch channel (:mod:`mlxops.jobs.channel`): the command keeps running and
printing; the reader waits at most a given time for each line, so silence is noticed
(``TimeoutError``) and never blocks it for longer. Closing a stream ends the command's
stdin, which is how the node's ``watch`` helper learns to exit.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from typing import TYPE_CHECKING, Protocol

from mlxops.transport.hostkeys import HostUnreachable

if TYPE_CHECKING:
    import paramiko


class LineStream(Protocol):
    """A long-lived command's stdout, line by line, as it comes (``Connection.stream``)."""

    def read_line(self, timeout: float) -> str | None:
        """The next line (without its newline); None when the command ended; TimeoutError
        when nothing came for ``timeout`` seconds; HostUnreachable when the connection broke."""
        ...

    def close(self) -> None:
        """End the command: its stdin ends (EOF), then its channel or process goes."""
        ...


class _Lines:
    """Bytes in, complete lines out: what both kinds of stream share."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> None:
        self._buffer += data

    def pop(self) -> str | None:
        end = self._buffer.find(b"\n")
        if end < 0:
            return None
        line = bytes(self._buffer[:end])
        del self._buffer[:end + 1]
        return line.decode(errors="replace")

    def rest(self) -> str | None:
        """What is left after the command ended: a last line without a newline, or None."""
        if not self._buffer:
            return None
        line = self._buffer.decode(errors="replace")
        self._buffer.clear()
        return line


class LocalLineStream:
    def __init__(self, proc: subprocess.Popen) -> None:
        self._proc = proc
        self._lines = _Lines()

    def read_line(self, timeout: float) -> str | None:
        deadline = time.monotonic() + timeout
        assert self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        while (line := self._lines.pop()) is None:
            wait = deadline - time.monotonic()
            if wait <= 0 or not select.select([fd], [], [], wait)[0]:
                raise TimeoutError(f"nothing for {timeout:g}s")
            data = os.read(fd, 1 << 16)
            if not data:
                return self._lines.rest()
            self._lines.feed(data)
        return line

    def close(self) -> None:
        for pipe in (self._proc.stdin, self._proc.stdout):
            if pipe is not None:
                pipe.close()
        try:
            self._proc.wait(timeout=1)
        except subprocess.TimeoutExpired:
            os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait()


class SSHLineStream:
    def __init__(self, name: str, channel: paramiko.Channel) -> None:
        self._name = name
        self._channel = channel
        self._lines = _Lines()

    def read_line(self, timeout: float) -> str | None:
        import paramiko  # loaded already: this stream runs on one of its channels

        deadline = time.monotonic() + timeout
        channel = self._channel
        try:
            while (line := self._lines.pop()) is None:
                if channel.recv_ready():
                    self._lines.feed(channel.recv(1 << 16))
                    continue
                if channel.eof_received or channel.closed:
                    return self._lines.rest()
                while channel.recv_stderr_ready():
                    channel.recv_stderr(1 << 16)  # not read: keep its window open
                wait = deadline - time.monotonic()
                if wait <= 0:
                    raise TimeoutError(f"nothing for {timeout:g}s")
                select.select([channel], [], [], min(wait, 0.5))
        except (OSError, paramiko.SSHException, EOFError) as exc:
            if isinstance(exc, TimeoutError):
                raise
            raise HostUnreachable(self._name, f"channel lost: {exc}") from None
        return line

    def close(self) -> None:
        import paramiko

        try:
            self._channel.shutdown_write()  # the command's stdin ends: it exits by itself
        except (OSError, paramiko.SSHException, EOFError):
            pass
        self._channel.close()
