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
import subprocess
import threading
import time
from typing import TYPE_CHECKING, Protocol

from mlxops.transport.hostkeys import HostUnreachable

if TYPE_CHECKING:
    import paramiko

#: Seconds after which a closed stream that was sent a request closes its SSH channel even
#: if the command has not exited (it should have: its stdin ended).
CLOSE_LATER = 60.0


class LineStream(Protocol):
    """A long-lived command's stdout, line by line, as it comes (``Connection.stream``)."""

    def read_line(self, timeout: float) -> str | None:
        """The next line (without its newline); None when the command ended; TimeoutError
        when nothing came for ``timeout`` seconds; HostUnreachable when the connection broke."""
        ...

    def send(self, line: str) -> None:
        """Write one line to the command's stdin (a request to it); a failure is ignored:
        the command is then gone or unreachable, which the reader finds out."""
        ...

    def close(self) -> None:
        """End the command: its stdin ends (EOF) after what was sent, which it reads first;
        then the channel (or the pipes) go. Never waits for the command."""
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

    def send(self, line: str) -> None:
        try:
            assert self._proc.stdin is not None
            self._proc.stdin.write(line.encode() + b"\n")
            self._proc.stdin.flush()
        except (OSError, ValueError):
            pass

    def close(self) -> None:
        for pipe in (self._proc.stdin, self._proc.stdout):
            if pipe is not None:
                try:
                    pipe.close()
                except OSError:
                    pass
        # It exits at the EOF, after a request it was sent: reaped without waiting here.
        threading.Thread(target=self._proc.wait, daemon=True).start()


class SSHLineStream:
    def __init__(self, name: str, channel: paramiko.Channel) -> None:
        self._name = name
        self._channel = channel
        self._lines = _Lines()
        self._sent = False

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

    def send(self, line: str) -> None:
        import paramiko

        try:
            self._channel.sendall(line.encode() + b"\n")
            self._sent = True
        except (OSError, paramiko.SSHException, EOFError):
            pass

    def close(self) -> None:
        import paramiko

        try:
            self._channel.shutdown_write()  # the command's stdin ends: it exits by itself
        except (OSError, paramiko.SSHException, EOFError):
            pass
        if not self._sent:
            self._close_channel()
            return
        # Closing the channel now could drop a request sshd has not written to the
        # command's stdin yet: the channel closes when the command exits, at the EOF
        # after it; at the latest, it is closed here later.
        timer = threading.Timer(CLOSE_LATER, self._close_channel)
        timer.daemon = True
        timer.start()

    def _close_channel(self) -> None:
        """Close the channel; one whose connection is already gone (the host went away,
        its transport ended) is closed as it is: paramiko's close then raises on the dead
        socket (EOFError), which must not end the watchdog that is letting go of it."""
        import paramiko

        try:
            self._channel.close()
        except (OSError, paramiko.SSHException, EOFError):
            pass
