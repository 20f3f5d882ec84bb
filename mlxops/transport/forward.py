"""A local port forwarded to a port on a host, over mlxops's own SSH connection to it
(``ssh -L``, with the host key verified as on every mlxops path).

:class:`Forward` listens on ``127.0.0.1`` and, for each connection it accepts, opens a
tunnel to the host's ``address``:``port`` (:meth:`Connection.open_tunnel`: a
``direct-tcpip`` channel of the one SSH transport, or a plain socket for a local host) and
copies bytes both ways until both sides closed: a streaming response is written out as its
chunks arrive, never buffered.

:func:`http_exchange` sends one HTTP/1.1 request over any such stream and reads the whole
answer, with a deadline: the watchdog's probe (``jobs/serveprobe.py``) and nothing else.
HTTP itself is the standard library's (``http.client``, its connection's socket being the
stream): status line, headers, ``Content-Length`` and chunked bodies are read as any
client reads them; only the deadline over the whole exchange is ours.
"""

from __future__ import annotations

import http.client
import io
import json
import logging
import selectors
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from mlxops.transport.connection import Connection

_CHUNK = 1 << 16


class _RefusedTunnels(logging.Filter):
    """paramiko logs every refused ``direct-tcpip`` channel as an error on stderr; the
    caller of ``open_tunnel`` gets it as ``ConnectionRefusedError`` and says what it means
    (a server not listening yet is the watchdog's every poll while it loads)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "open FAILED" not in record.getMessage()


logging.getLogger("paramiko.transport").addFilter(_RefusedTunnels())


class Forward:
    """``127.0.0.1:local_port`` -> ``address``:``port`` on ``conn``'s host, until closed.

    One thread does everything (accept, open the tunnel, copy both ways) over a selector:
    a request through the forward then costs no thread start and no hand-off between
    threads, only paramiko's own transport thread (on a busy 2-core machine each hand-off
    was milliseconds). Sends block: the clients are on this machine, and read what they
    asked for.
    """

    def __init__(self, conn: Connection, address: str, port: int, *, local_port: int = 0,
                 connect_timeout: float = 10.0):
        self.conn, self.address, self.port = conn, address, port
        self.connect_timeout = connect_timeout
        self._listener = socket.create_server(("127.0.0.1", local_port))
        self.local_port: int = self._listener.getsockname()[1]
        self._closed = threading.Event()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._peer: dict[Any, Any] = {}     # each open end -> the other end
        self._done: set[Any] = set()        # ends whose reading side ended
        self.connections = 0                # accepted so far
        self.errors: list[str] = []         # tunnels that could not be opened, why
        self._thread = threading.Thread(target=self._loop, daemon=True,
                                        name=f"forward-{self.local_port}")
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.local_port}"

    def _loop(self) -> None:
        try:
            while not self._closed.is_set():
                for key, _ in self._selector.select(timeout=0.5):
                    if key.fileobj is self._listener:
                        self._accept()
                    else:
                        self._copy(key.fileobj)
        except (OSError, ValueError):
            if not self._closed.is_set():
                raise
        finally:
            for end in list(self._peer):
                end.close()

    def _accept(self) -> None:
        client, _ = self._listener.accept()
        self.connections += 1
        try:
            remote = self.conn.open_tunnel(self.address, self.port, self.connect_timeout)
        except Exception as exc:  # noqa: BLE001 - any failure: this client is refused
            self.errors.append(f"{type(exc).__name__}: {exc}")
            client.close()
            return
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        client.setblocking(True)
        self._peer[client], self._peer[remote] = remote, client
        for end in (client, remote):
            self._selector.register(end, selectors.EVENT_READ, None)

    def _copy(self, source: Any) -> None:
        """What ``source`` has, to its peer; at its end, half-close the peer (HTTP's
        half-close) and, once both ends ended, close both."""
        sink = self._peer[source]
        try:
            data = source.recv(_CHUNK)
            if data:
                sink.sendall(data)
                return
        except OSError:
            pass  # reset: as an end
        self._selector.unregister(source)
        self._done.add(source)
        try:
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        if sink in self._done:
            for end in (source, sink):
                self._done.discard(end)
                self._peer.pop(end, None)
                end.close()

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=5)
        self._listener.close()
        self._selector.close()

    def __enter__(self) -> Forward:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class HttpAnswer:
    status: int
    body: bytes
    seconds: float                      # from the first byte sent to the last received

    def json(self) -> Any:
        return json.loads(self.body)


class _Deadline:
    """A stream (a socket or a paramiko channel) as ``http.client`` uses a socket, every
    send and receive given what is left of one deadline (``TimeoutError`` past it)."""

    def __init__(self, stream: Any, deadline: float, timeout: float) -> None:
        self.stream, self.deadline, self.timeout = stream, deadline, timeout

    def _left(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no whole answer in {self.timeout:g}s")
        self.stream.settimeout(left)
        return left

    def sendall(self, data: bytes) -> None:
        self._left()
        self.stream.sendall(data)

    def recv_into(self, buffer: memoryview) -> int:
        self._left()
        try:
            data = self.stream.recv(len(buffer))
        except TimeoutError:
            raise TimeoutError(f"no whole answer in {self.timeout:g}s") from None
        buffer[:len(data)] = data
        return len(data)

    def makefile(self, mode: str = "rb", *args: Any, **kw: Any) -> io.BufferedReader:
        return io.BufferedReader(_Reader(self), _CHUNK)

    def close(self) -> None:
        pass  # the stream is the caller's to close


class _Reader(io.RawIOBase):
    def __init__(self, sock: _Deadline) -> None:
        self.sock = sock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        return self.sock.recv_into(memoryview(buffer).cast("B"))


class _Over(http.client.HTTPConnection):
    """An ``HTTPConnection`` whose socket is a stream already open (never connects)."""

    def __init__(self, sock: _Deadline) -> None:
        super().__init__("127.0.0.1", timeout=sock.timeout)
        self._over = sock

    def connect(self) -> None:
        self.sock = self._over


def http_exchange(stream: Any, method: str, path: str, body: Any = None, *,
                  timeout: float) -> HttpAnswer:
    """One request on ``stream`` (a socket or a paramiko channel), ``Connection: close``,
    the whole answer (a chunked one decoded) read by ``timeout`` (``TimeoutError`` past
    it; ``ConnectionError`` for an answer that is not HTTP)."""
    payload = b"" if body is None else json.dumps(body).encode()
    start = time.monotonic()
    conn = _Over(_Deadline(stream, start + timeout, timeout))
    try:
        conn.request(method, path, body=payload, headers={
            "Connection": "close", "Content-Type": "application/json"})
        answer = conn.getresponse()
        data = answer.read()
    except http.client.IncompleteRead as exc:
        raise ConnectionError(f"the answer was cut short: {exc}") from None
    except http.client.HTTPException as exc:
        raise ConnectionError(f"not an HTTP answer: {type(exc).__name__}: {exc}") from None
    return HttpAnswer(answer.status, data, time.monotonic() - start)
