"""The heartbeat of a rank that has not made its first step yet (stdlib only; synced).

Between its start and its first step a rank loads its data and checkpoint and compiles
its step (on a cold Mac, about 40 s of Metal kernels), writing no progress of its own:
without a beat it looks silent. A thread writes the ``starting`` heartbeat every
:data:`~mlxops.node.protocol.HEARTBEAT_EVERY` seconds until the loop's first step is
written. Policy (``mlxops.jobs.status.stall_age``): the beat says the process runs, not
that it gets anywhere, so the watchdog still ends a start that takes longer than
``restart.start_timeout`` (a first collective waiting forever keeps the beat going); a
start whose beat stops (a frozen or wedged process) is silent, stalled after
``stall_timeout``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from mlxops.node.protocol import HEARTBEAT_EVERY


class StartBeat:
    """``beat()`` at once and then every ``every`` seconds, in a daemon thread, until
    :meth:`stop` (a rank that dies exits with it)."""

    def __init__(self, beat: Callable[[], None], every: float = HEARTBEAT_EVERY) -> None:
        self._beat, self._every = beat, every
        self._done = threading.Event()
        self._lock = threading.Lock()  # a beat is never written after stop() returned
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="mlxops-start-beat")

    def start(self) -> StartBeat:
        """The first beat here, before returning (no window where the rank has none)."""
        self._beat()
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._lock:
            self._done.set()

    def _run(self) -> None:
        while not self._done.wait(self._every):
            with self._lock:
                if self._done.is_set():
                    return
                self._beat()
