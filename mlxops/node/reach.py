"""Whether this node and its peers reach each other on the ring ports: the ``reach``
command of ``mlxops check`` (docs/node-protocol.md).

Every node of the check runs it at the same time. Each listens on its own ring ports (those
it can bind: a busy one is the ``ready`` command's finding, not this one's) and connects to
every port of every peer, retrying until the peer listens, saying who it is in one line.
A node stops once it reached every peer's ports and every peer said hello on each port it
listens on, or when the time is up; so a healthy cluster answers in about a second, and a
pair a firewall separates costs the whole ``--seconds``. The ports are closed again when
it answers: nothing stays on the node.
"""

from __future__ import annotations

import select
import socket
import threading
import time

from mlxops.node import protocol

HELLO = b"mlxops-reach "
RETRY = 0.1          # seconds between connection attempts to a peer not listening yet
READ_HELLO = 0.5     # seconds to wait for a connected peer's hello line


def _family(ip: str) -> int:
    return socket.AF_INET6 if ":" in ip else socket.AF_INET


def listen(ip: str, ports: list[int]) -> dict[int, socket.socket]:
    """Listeners on the ports that are free (SO_REUSEADDR, as the ring backend binds)."""
    listeners = {}
    for port in ports:
        s = socket.socket(_family(ip), socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((ip, port))
            s.listen(64)
        except OSError:
            s.close()
            continue
        listeners[port] = s
    return listeners


class Dialer:
    """Connects to every peer port (one thread each) until it answers or time is up."""

    def __init__(self, name: str, peers: dict[str, tuple[str, list[int]]], deadline: float):
        self.hello = HELLO + name.encode() + b"\n"
        self.deadline = deadline
        self.lock = threading.Lock()
        self.reached: dict[str, list[int]] = {}
        self.errors: dict[str, str] = {}
        self.threads = [threading.Thread(target=self._dial, args=(peer, ip, port), daemon=True)
                        for peer, (ip, ports) in peers.items() for port in ports]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def done(self) -> bool:
        return not any(t.is_alive() for t in self.threads)

    def _dial(self, peer: str, ip: str, port: int) -> None:
        why = "no attempt"
        while (left := self.deadline - time.monotonic()) > 0:
            try:
                with socket.create_connection((ip, port), timeout=min(1.0, left)) as conn:
                    conn.sendall(self.hello)
                with self.lock:
                    self.reached.setdefault(peer, []).append(port)
                return
            except OSError as exc:
                why = f"{ip}:{port}: {exc.strerror or exc or type(exc).__name__}"
                time.sleep(min(RETRY, max(0.0, self.deadline - time.monotonic())))
        with self.lock:
            self.errors.setdefault(peer, why)


def _hello_from(conn: socket.socket) -> str | None:
    """The peer name a connection announced, None if it said nothing we know."""
    conn.settimeout(READ_HELLO)
    data = b""
    try:
        while b"\n" not in data and len(data) < 512:
            chunk = conn.recv(512)
            if not chunk:
                break
            data += chunk
    except OSError:
        return None
    line = data.split(b"\n", 1)[0]
    return line[len(HELLO):].decode(errors="replace") if line.startswith(HELLO) else None


def reach(name: str, ip: str, ports: list[int], peers: dict[str, tuple[str, list[int]]],
          seconds: float) -> protocol.ReachAnswer:
    deadline = time.monotonic() + seconds
    listeners = listen(ip, ports)
    expected = {(peer, port) for peer in peers for port in listeners}
    heard: set[tuple[str, int]] = set()
    dialer = Dialer(name, peers, deadline)
    dialer.start()
    by_socket = {s: port for port, s in listeners.items()}
    try:
        while time.monotonic() < deadline and not (dialer.done() and expected <= heard):
            ready, _, _ = select.select(list(by_socket), [], [], 0.05)
            for s in ready:
                try:
                    conn, _ = s.accept()
                except OSError:
                    continue
                with conn:
                    peer = _hello_from(conn)
                if peer is not None:
                    heard.add((peer, by_socket[s]))
    finally:
        for s in listeners.values():
            s.close()
    for t in dialer.threads:
        t.join(timeout=0.1)
    with dialer.lock:
        reached = {peer: sorted(p) for peer, p in dialer.reached.items()}
        unreached = dict(dialer.errors)
    return protocol.ReachAnswer(listened=sorted(listeners), reached=reached,
                                unreached=unreached)
