"""The bench's measuring server on a node: the ``bench-serve`` and ``bench-stop`` commands
(docs/node-protocol.md, "Bench commands").

``bench-serve`` binds the port first (a busy port fails the command, nothing starts), then
forks a server detached from the SSH session, like ``spawn`` starts ranks: its own session
(so ``bench-stop`` ends it and its ``iperf3 -s`` with one signal to the group), output to
``bench-server.log``, its pid in ``bench-server.pid``. It serves until ``bench-stop`` or its
deadline, whichever comes first, so a controller that dies leaves nothing running for long.

What it serves, one thread per connection (the wire is :mod:`mlxops.node.netwire`'s):

* ``echo``: latency ping-pong, each message sent straight back (TCP_NODELAY);
* ``test``: a control connection for one bandwidth run; the client's ``data`` connections
  join it, the server counts the bytes of the client's streams over its own window and
  sends the result, and sends on the streams the client receives, until told to stop.
"""

from __future__ import annotations

import os
import select
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from mlxops.node.netwire import Streams, WireError, read_line, recv_exact, send_line, window
from mlxops.node.procs import group_alive, process_table
from mlxops.node.protocol.bench import (
    BOTH,
    DOWN,
    MODES,
    SERVER_LOG,
    SERVER_PID,
    UP,
    ServeAnswer,
    StopServerAnswer,
)
from mlxops.node.rundir import read_int

ACCEPT_POLL = 0.5
JOIN_TIMEOUT = 10.0        # data connections must join their test within this
MAX_STREAMS = 128
MAX_ECHO = 1 << 20
# Where iperf3 lives when a non-interactive SSH session's PATH lacks it (Homebrew, MacPorts).
IPERF3_DIRS = ("/opt/homebrew/bin", "/usr/local/bin", "/opt/local/bin", "/usr/bin")


def find_iperf3() -> str | None:
    return shutil.which("iperf3", path=os.pathsep.join([os.environ.get("PATH", ""),
                                                        *IPERF3_DIRS]))


def listen(ip: str, port: int) -> list[socket.socket]:
    """Listeners on ``ip:port`` and, unless ``ip`` is loopback, 127.0.0.1:port (the loopback
    run). SO_REUSEADDR as the ring backend uses it: only a live listener makes a port busy."""
    addresses = [ip] if ip in ("127.0.0.1", "localhost") else [ip, "127.0.0.1"]
    socks = []
    try:
        for address in addresses:
            family = socket.AF_INET6 if ":" in address else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((address, port))
            except OSError as exc:
                raise OSError(f"port {port} on {address} is busy or not ours: "
                              f"{exc.strerror}") from None
            sock.listen(64)
    except BaseException:
        for sock in socks:
            sock.close()
        raise
    return socks


def serve(run_dir: Path, *, ip: str, port: int, deadline: float, iperf3_port: int
          ) -> ServeAnswer:
    """Start the server detached; returns once it listens (and its iperf3, if asked, runs)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    stop_server(run_dir)  # an earlier bench's server, if one outlived its controller
    listeners = listen(ip, port)
    iperf3 = find_iperf3()
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: the server
        code = 1
        try:
            os.close(ready_r)
            _detach(run_dir, keep=[ready_w, *(s.fileno() for s in listeners)])
            # bench-stop's SIGTERM unwinds (below), so iperf3 is reaped, not left a zombie.
            signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
            (run_dir / SERVER_PID).write_text(f"{os.getpid()}\n")
            helper = _start_iperf3(iperf3, ip, iperf3_port) if iperf3 and iperf3_port else None
            os.write(ready_w, f"{iperf3_port if helper else 0}\n".encode())
            os.close(ready_w)
            try:
                Server(listeners).run(time.monotonic() + deadline)
            finally:
                if helper is not None:
                    helper.terminate()
                    helper.wait(timeout=5)
                (run_dir / SERVER_PID).unlink(missing_ok=True)
            code = 0
        finally:
            os._exit(code)
    os.close(ready_w)
    for sock in listeners:
        sock.close()
    line = _read_ready(ready_r, 15.0)
    if line is None:
        raise OSError(f"the bench server did not start (see {run_dir / SERVER_LOG})")
    started = int(line)
    return ServeAnswer(pid=pid, port=port, iperf3=iperf3,
                       iperf3_port=started or None)


def _read_ready(fd: int, timeout: float) -> str | None:
    try:
        ready, _, _ = select.select([fd], [], [], timeout)
        data = os.read(fd, 64).decode().strip() if ready else ""
    finally:
        os.close(fd)
    return data if data.isdigit() else None


def _detach(run_dir: Path, keep: list[int]) -> None:
    """Own session, stdin /dev/null, output to the log, no other descriptor of the SSH
    session's (so the SSH command returns at once)."""
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDONLY)
    log = os.open(run_dir / SERVER_LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(devnull, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = os.fdopen(2, "w", buffering=1)
    low = 3
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 65536)


def _start_iperf3(iperf3: str, ip: str, port: int) -> subprocess.Popen | None:
    """``iperf3 -s`` on ``ip:port`` in this (the server's) process group; None when it did
    not stay up (e.g. the port is taken)."""
    proc = subprocess.Popen([iperf3, "-s", "-B", ip, "-p", str(port)],
                            stdin=subprocess.DEVNULL)
    time.sleep(0.3)
    if proc.poll() is not None:
        print(f"iperf3 -s on {ip}:{port} exited with code {proc.returncode}", flush=True)
        return None
    return proc


class _Pending:
    """A bandwidth run waiting for its data connections."""

    def __init__(self, up: int, down: int):
        self.want = {UP: up, DOWN: down}
        self.socks: dict[str, list[socket.socket]] = {UP: [], DOWN: []}
        self.cond = threading.Condition()

    def join(self, direction: str, sock: socket.socket) -> None:
        with self.cond:
            if len(self.socks[direction]) >= self.want[direction]:
                raise WireError(f"too many {direction} streams")
            self.socks[direction].append(sock)
            self.cond.notify_all()

    def wait(self, timeout: float) -> bool:
        with self.cond:
            return self.cond.wait_for(
                lambda: all(len(self.socks[d]) == n for d, n in self.want.items()), timeout)


class Server:
    def __init__(self, listeners: list[socket.socket]):
        self.listeners = listeners
        self.tests: dict[str, _Pending] = {}
        self.lock = threading.Lock()

    def run(self, until: float) -> None:
        with selectors.DefaultSelector() as sel:
            for sock in self.listeners:
                sel.register(sock, selectors.EVENT_READ)
            while time.monotonic() < until:
                for key, _ in sel.select(timeout=ACCEPT_POLL):
                    try:
                        conn, _ = key.fileobj.accept()  # type: ignore[union-attr]
                    except OSError:
                        continue
                    threading.Thread(target=self.handle, args=(conn,), daemon=True).start()

    def handle(self, conn: socket.socket) -> None:
        keep = False
        try:
            hdr = read_line(conn, JOIN_TIMEOUT)
            if hdr is None:
                return
            op = hdr.get("op")
            if op == "echo":
                self.echo(conn, int(hdr["size"]))
            elif op == "test":
                self.test(conn, hdr)
            elif op == "data":
                self.data(conn, hdr)
                keep = True  # the test owns it now
            else:
                send_line(conn, {"error": f"unknown op {op!r}"})
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"{type(exc).__name__}: {exc}", flush=True)
            try:
                send_line(conn, {"error": f"{type(exc).__name__}: {exc}"})
            except OSError:
                pass
        finally:
            if not keep:
                conn.close()

    def echo(self, conn: socket.socket, size: int) -> None:
        if not 1 <= size <= MAX_ECHO:
            raise ValueError(f"echo size {size}")
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        send_line(conn, {"ok": True})
        conn.settimeout(30.0)
        view = memoryview(bytearray(size))
        while recv_exact(conn, view):
            conn.sendall(view)

    def data(self, conn: socket.socket, hdr: dict[str, Any]) -> None:
        with self.lock:
            pending = self.tests.get(str(hdr["id"]))
        if pending is None or hdr.get("dir") not in (UP, DOWN):
            raise WireError(f"no test {hdr.get('id')!r} waits for a {hdr.get('dir')!r} stream")
        pending.join(hdr["dir"], conn)

    def test(self, ctrl: socket.socket, hdr: dict[str, Any]) -> None:
        test_id, mode = str(hdr["id"]), hdr["mode"]
        streams, seconds, omit = int(hdr["streams"]), float(hdr["seconds"]), float(hdr["omit"])
        if mode not in MODES or not 1 <= streams <= MAX_STREAMS or not 0 < seconds <= 3600 \
                or not 0 <= omit <= 600:
            raise ValueError(f"bad test {hdr!r:.200}")
        pending = _Pending(up=streams if mode in (UP, BOTH) else 0,
                           down=streams if mode in (DOWN, BOTH) else 0)
        with self.lock:
            self.tests[test_id] = pending
        streams_ = None
        try:
            send_line(ctrl, {"ok": True})
            if not pending.wait(JOIN_TIMEOUT):
                raise WireError("the data connections did not all arrive")
            # This side sends on the client's "down" streams and counts its "up" streams.
            streams_ = Streams(senders=pending.socks[DOWN], receivers=pending.socks[UP])
            start = time.monotonic()
            send_line(ctrl, {"go": True})
            streams_.start()
            if pending.socks[UP]:
                nbytes, length = window(streams_.meter, start, omit, seconds)
                send_line(ctrl, {"bytes": nbytes, "seconds": length})
            read_line(ctrl, omit + seconds + 30.0)  # the client's stop, or its EOF
        finally:
            with self.lock:
                self.tests.pop(test_id, None)
            if streams_ is not None:
                streams_.close()
            else:
                for sock in pending.socks[UP] + pending.socks[DOWN]:
                    sock.close()


def stop_server(run_dir: Path, grace: float = 2.0) -> StopServerAnswer:
    """End the server of ``bench-server.pid`` (its whole process group: iperf3 too)."""
    pidfile = run_dir / SERVER_PID
    pid = read_int(pidfile)
    if pid is None:
        return StopServerAnswer(pid=None, was_running=False, alive=False)
    running = _is_server(pid)
    if running:
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, grace)):
            try:
                os.killpg(pid, sig)
            except (ProcessLookupError, PermissionError):
                break
            deadline = time.monotonic() + wait
            while group_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if not group_alive(pid):
                break
    alive = running and group_alive(pid)
    if not alive:
        pidfile.unlink(missing_ok=True)
    return StopServerAnswer(pid=pid, was_running=running, alive=alive)


def _is_server(pid: int) -> bool:
    """The pid file's process still leads its group and is a Python: not a reused pid."""
    return any(p == pid and g == pid and state != "Z" and "python" in name.lower()
               for p, _, g, state, name in process_table())
