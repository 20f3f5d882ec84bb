"""A bench server on this machine's loopback, shared by the bench tests of the node side
(tests/unit/node/test_bench_node.py) and of the controller side
(tests/unit/bench/test_bench_budget.py): a helper beside node_answers.py, imported by bare
name (tests/unit/conftest.py says why that works from the sub-folders)."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from mlxops.node.netserver import Server, listen


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def server():
    """A server in a thread on 127.0.0.1 (the forked one is tested below)."""
    port = free_port()
    listeners = listen("127.0.0.1", port)
    thread = threading.Thread(target=Server(listeners).run, args=(time.monotonic() + 60,),
                              daemon=True)
    thread.start()
    yield port
    for sock in listeners:
        sock.close()
