"""A local port forwarded to a port on a host, over mlxops's own SSH connection to it
(``ssh -L``, with the host key verified as on every mlxops path).

:class:`Forward` listens on ``127.0.0.1`` and, for each connection it accepts, opens a
tunnel to the host's ``address``:``port`` (:meth:`Connection.open_tunnel`: a
``direct-tcpip`` channel of the one SSH transport, or a plain socket for a local host) and
copies bytes both ways until either side closes. One thread per direction per connection:
a streaming response is written out as its chunks arrive, never buffered.

:func:`http_exchange` sends one HTTP/1.1 request over any such stream and reads the whole
answer, with a deadline: the watchdog's probe (``jobs/serveprobe.py``) and nothing else.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from mlxops.transport.connection import Connection

_CHUNK = 1 << 16


class Forward:
    """``127.0.0.1:local_port`` -> ``address``:``port`` on ``conn``'s host, until closed."""

    def __init__(self, conn: Connection, address: str, port: int, *, local_port: int = 0,
                 connect_timeout: float = 10.0):
        self.conn, self.address, self.port = conn, address, port
        self.connect_timeout = connect_timeout
        self._listener = socket.create_server(("127.0.0.1", local_port))
        self.local_port: int = self._listener.getsockname()[1]
        self._closed = threading.Event()
        self._open: set[Any] = set()
        self._lock = threading.Lock()
        self.connections = 0                # accepted so far
        self.errors: list[str] = []         # tunnels that could not be opened, why
        self._thread = threading.Thread(target=self._accept, daemon=True,
                                        name=f"forward-{self.local_port}")
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.local_port}"

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            self.connections += 1
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            remote = self.conn.open_tunnel(self.address, self.port, self.connect_timeout)
        except Exception as exc:  # noqa: BLE001 - any failure: this client is refused
            self.errors.append(f"{type(exc).__name__}: {exc}")
            client.close()
            return
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._lock:
            self._open.update((client, remote))
        back = threading.Thread(target=_pump, args=(remote, client), daemon=True)
        back.start()
        _pump(client, remote)
        back.join()
        with self._lock:
            self._open.difference_update((client, remote))
        for end in (client, remote):
            end.close()

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        with self._lock:
            ends = list(self._open)
        for end in ends:
            try:
                end.close()
            except OSError:
                pass

    def __enter__(self) -> Forward:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _pump(source: Any, sink: Any) -> None:
    """Copy ``source`` to ``sink`` until ``source`` ends; then end ``sink``'s writing
    side, so the other direction can still finish (HTTP's half-close)."""
    try:
        while data := source.recv(_CHUNK):
            sink.sendall(data)
    except OSError:
        pass
    try:
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        pass


@dataclass
class HttpAnswer:
    status: int
    body: bytes
    seconds: float                      # from the first byte sent to the last received

    def json(self) -> Any:
        return json.loads(self.body)


def http_exchange(stream: Any, method: str, path: str, body: Any = None, *,
                  timeout: float) -> HttpAnswer:
    """One request on ``stream`` (a socket or a paramiko channel), ``Connection: close``,
    the whole answer read by ``timeout`` (``TimeoutError`` past it). Chunked bodies are
    not decoded: the probe asks for a whole JSON body."""
    payload = b"" if body is None else json.dumps(body).encode()
    head = (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n")
    start = time.monotonic()
    deadline = start + timeout
    stream.settimeout(timeout)
    stream.sendall(head.encode() + payload)
    data = bytearray()
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no whole answer in {timeout:g}s")
        stream.settimeout(left)
        try:
            chunk = stream.recv(_CHUNK)
        except TimeoutError:
            raise TimeoutError(f"no whole answer in {timeout:g}s") from None
        if not chunk:
            break
        data += chunk
    status_line, _, rest = bytes(data).partition(b"\r\n")
    _, _, body = rest.partition(b"\r\n\r\n")
    try:
        status = int(status_line.split()[1])
    except (IndexError, ValueError):
        raise ConnectionError(f"not an HTTP answer: {bytes(data[:80])!r}") from None
    return HttpAnswer(status, body, time.monotonic() - start)
