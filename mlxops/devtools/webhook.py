"""A webhook receiver on loopback for the notification tests (tests/unit/notify/test_notify.py,
tests/integration/test_operate.py): a real HTTP server that records what it is POSTed and
answers as told, or holds requests open, the way a slow or dead chat service would."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Receiver:
    """Answers each POST with the next of ``codes`` (then 200); with ``hang``, holds every
    request open until :attr:`release` is set. :attr:`bodies`: ``(time received, JSON)``.
    ``host``: the address it listens on (a sandbox bridge's, for a sender on a node)."""

    def __init__(self, codes: Sequence[int] = (), hang: bool = False,
                 host: str = "127.0.0.1") -> None:
        self.bodies: list[tuple[float, dict[str, Any]]] = []
        self.codes = list(codes)
        self.hang = hang
        self.release = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                receiver.bodies.append((time.time(), body))
                if receiver.hang:
                    receiver.release.wait(120)
                code = receiver.codes.pop(0) if receiver.codes else 200
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://{host}:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def kinds(self) -> list[str]:
        """The event kinds received, in order."""
        return [body["kind"] for _, body in self.bodies]

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
