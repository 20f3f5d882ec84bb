"""A watch channel on a connection that is already gone closes without raising
(mlxops/transport/streams.py): a CI run's watchdog ended with paramiko's EOFError from
closing such a channel, after the job it followed had finished."""

from __future__ import annotations

import time

import pytest

from mlxops.transport import streams
from mlxops.transport.streams import SSHLineStream


class DeadChannel:
    """A paramiko channel whose transport's socket is closed: every write raises."""

    def __init__(self) -> None:
        self.close_calls = 0

    def shutdown_write(self) -> None:
        raise EOFError()

    def close(self) -> None:
        self.close_calls += 1
        raise EOFError()


@pytest.mark.parametrize("sent", [False, True])
def test_closing_a_stream_on_a_dead_connection_does_not_raise(monkeypatch, sent):
    monkeypatch.setattr(streams, "CLOSE_LATER", 0.0)
    channel = DeadChannel()
    stream = SSHLineStream("node3", channel)
    stream._sent = sent
    stream.close()
    if sent:   # closed later, by a timer: wait for it
        deadline = time.monotonic() + 5
        while not channel.close_calls and time.monotonic() < deadline:
            time.sleep(0.01)
    assert channel.close_calls == 1
