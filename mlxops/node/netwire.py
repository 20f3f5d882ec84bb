"""What the bench's server and client share: JSON lines on a socket, streams that send or
count bytes, the receiver's measuring window, and nearest-rank percentiles.

Standard library only (synced to nodes). The wire: every connection starts with one JSON
line from the client saying what it is for (``echo``, ``test`` or ``data``); the server
answers control lines the same way. Data connections carry nothing but bytes after their
first line.
"""

from __future__ import annotations

import json
import math
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any

LINE_MAX = 4096
CONNECT_TIMEOUT = 5.0
IO_TIMEOUT = 1.0               # data sockets: how often a blocked stream looks at its stop
SEND_CHUNK = 128 * 1024
RECV_CHUNK = 256 * 1024


class WireError(OSError):
    """The peer said something else than the protocol expects (or nothing in time)."""


def send_line(sock: socket.socket, doc: dict[str, Any]) -> None:
    sock.sendall((json.dumps(doc) + "\n").encode())


def read_line(sock: socket.socket, timeout: float) -> dict[str, Any] | None:
    """One JSON line; None at EOF. Reads a byte at a time so that nothing after the line
    (a data stream's first bytes) is taken from the socket."""
    sock.settimeout(timeout)
    raw = bytearray()
    while len(raw) < LINE_MAX:
        try:
            byte = sock.recv(1)
        except TimeoutError:
            raise WireError(f"no answer within {timeout:g}s") from None
        if not byte:
            return None if not raw else _bad(raw)
        if byte == b"\n":
            try:
                doc = json.loads(raw)
            except ValueError:
                return _bad(raw)
            return doc if isinstance(doc, dict) else _bad(raw)
        raw += byte
    raise WireError("line too long")


def _bad(raw: bytes) -> dict[str, Any]:
    raise WireError(f"not a protocol line: {bytes(raw[:80])!r}")


def expect(sock: socket.socket, key: str, timeout: float) -> dict[str, Any]:
    """The next line, which must hold ``key`` (an ``error`` line says why not)."""
    doc = read_line(sock, timeout)
    if doc is None:
        raise WireError(f"connection closed while waiting for {key!r}")
    if "error" in doc:
        raise WireError(str(doc["error"]))
    if key not in doc:
        raise WireError(f"want {key!r}, got {doc!r:.100}")
    return doc


def connect(ip: str, port: int, *, nodelay: bool = False) -> socket.socket:
    sock = socket.create_connection((ip, port), timeout=CONNECT_TIMEOUT)
    if nodelay:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def recv_exact(sock: socket.socket, view: memoryview) -> bool:
    """Fill ``view``; False at EOF."""
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if not n:
            return False
        got += n
    return True


class Meter:
    """Bytes received per stream; each receiving thread adds to its own slot only."""

    def __init__(self, streams: int):
        self.counts = [0] * streams

    def total(self) -> int:
        return sum(self.counts)


class Streams:
    """Threads that send on some sockets and count what arrives on others, until stopped."""

    def __init__(self, senders: Sequence[socket.socket], receivers: Sequence[socket.socket]):
        self.meter = Meter(len(receivers))
        self.stop = threading.Event()
        self._socks = [*senders, *receivers]
        self._threads = [threading.Thread(target=self._send, args=(s,), daemon=True)
                         for s in senders]
        self._threads += [threading.Thread(target=self._receive, args=(s, i), daemon=True)
                          for i, s in enumerate(receivers)]

    def start(self) -> None:
        for sock in self._socks:
            sock.settimeout(IO_TIMEOUT)
        for thread in self._threads:
            thread.start()

    def _send(self, sock: socket.socket) -> None:
        chunk = memoryview(bytes(SEND_CHUNK))
        while not self.stop.is_set():
            try:
                sock.send(chunk)
            except TimeoutError:
                continue  # the receiver is slow or stopped reading: look at stop again
            except OSError:
                return

    def _receive(self, sock: socket.socket, slot: int) -> None:
        view = memoryview(bytearray(RECV_CHUNK))
        counts = self.meter.counts
        while not self.stop.is_set():
            try:
                n = sock.recv_into(view)
            except TimeoutError:
                continue
            except OSError:
                return
            if not n:
                return
            counts[slot] += n

    def close(self) -> None:
        """Stop every thread and close every socket (the peer sees EOF or a reset)."""
        self.stop.set()
        for sock in self._socks:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout=IO_TIMEOUT + 1)
        for sock in self._socks:
            sock.close()


def sleep_until(t: float) -> None:
    while (left := t - time.monotonic()) > 0:
        time.sleep(min(left, 0.5))


def window(meter: Meter, start: float, omit: float, seconds: float) -> tuple[int, float]:
    """Bytes that arrived between ``start + omit`` and ``start + omit + seconds`` (this
    side's clock), and the window's actual length."""
    sleep_until(start + omit)
    b0, t0 = meter.total(), time.monotonic()
    sleep_until(start + omit + seconds)
    b1, t1 = meter.total(), time.monotonic()
    return b1 - b0, t1 - t0


def gbps(nbytes: int, seconds: float) -> float:
    """Gbit/s, decimal (1e9 bit/s), as iperf3 reports."""
    return nbytes * 8 / seconds / 1e9 if seconds > 0 else 0.0


def nearest_rank(ordered: Sequence[float], p: float) -> float:
    """The nearest-rank ``p``-th percentile of sorted values: the smallest value with at
    least p% of the values at or below it."""
    if not ordered:
        raise ValueError("no values")
    k = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[k - 1]
