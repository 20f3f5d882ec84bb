"""HTTP through mlxops's SSH connection to a node (transport/forward.py's ``http_exchange``
over a ``direct-tcpip`` channel), against a server on the node's own loopback that answers
as a streaming server does, chunked: bash and Mac-like (zsh) sandbox nodes."""

from __future__ import annotations

import time

import pytest

from mlxops.inventory import load_inventory
from mlxops.transport.forward import http_exchange

PORT = 18931
SERVER = f'''
import json
from http.server import BaseHTTPRequestHandler, HTTPServer

class Chunked(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        asked = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        body = json.dumps({{"usage": {{"completion_tokens": asked["max_tokens"]}},
                            "choices": [{{"text": "x" * asked["max_tokens"]}}]}}).encode()
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Connection", "close")
        self.end_headers()
        for i in range(0, len(body), 9):
            part = body[i:i + 9]
            self.wfile.write(b"%x\\r\\n" % len(part) + part + b"\\r\\n")
            self.wfile.flush()
        self.wfile.write(b"0\\r\\n\\r\\n")

    def log_message(self, *args):
        pass

HTTPServer(("127.0.0.1", {PORT}), Chunked).handle_request()
'''


@pytest.fixture(params=["sandbox", "mac_sandbox"])
def node(request):
    box = request.getfixturevalue(request.param)
    connector = request.getfixturevalue("connector")
    conn = connector.connect(load_inventory(box.inventory_path).hosts["node1"])
    # The server answers one request and exits; its pid is kept to end it if it did not.
    started = conn.run(f"cat > chunked_server.py && {{ {box.python} chunked_server.py "
                       "</dev/null >/dev/null 2>&1 & echo $!; }",
                       stdin=SERVER.encode(), timeout=30)
    assert started.ok, started.stderr
    pid = int(started.stdout.split()[-1])
    yield conn
    conn.run(f"kill {pid} 2>/dev/null; rm -f chunked_server.py", timeout=30)


def tunnel(conn, seconds: float = 30):
    """A channel to the server once it listens (a Python starting on a loaded node)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return conn.open_tunnel("127.0.0.1", PORT, 10)
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_a_chunked_answer_through_the_ssh_channel_is_decoded(node):
    channel = tunnel(node)
    try:
        answer = http_exchange(channel, "POST", "/v1/completions", {"max_tokens": 40},
                               timeout=20)
    finally:
        channel.close()
    assert answer.status == 200
    assert answer.json() == {"usage": {"completion_tokens": 40}, "choices": [{"text": "x" * 40}]}
