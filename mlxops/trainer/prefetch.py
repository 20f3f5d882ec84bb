"""Read ahead: the next steps' rows on a background thread, while this step computes.

A rank's rows of step ``s`` are a pure function of ``(s, first sample, count)`` (data.py),
so reading them early changes nothing but when: a run with prefetching and one without
train on the same bytes, and a resume is bitwise equal either way. The thread reads the
steps after the one asked for, at most ``depth`` ahead (a bounded queue: memory stays
``depth`` steps of rows). When the plan changes under it (``balance: auto`` took another
split, an out-of-memory back-off redid a step) the rows it read are for another slice:
:meth:`Prefetcher.rows` sees the key differ, drops them, reads in the step and starts the
thread again from the next step.

numpy copies out of a memory map release the GIL for large reads only; what the thread
competes with is the loop's Python, which is idle while MLX computes the step.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

import numpy as np

#: (step, first sample, count): which rows a read is of.
Key = tuple[int, int, int]


class Prefetcher:
    """Rows of step after step, read ``depth`` steps ahead on a daemon thread.

    ``read(start, count)`` reads rows; ``plan(step)`` says which (first sample, count) a
    step takes as the rank runs now.
    """

    def __init__(self, read: Callable[[int, int], np.ndarray],
                 plan: Callable[[int], tuple[int, int]], depth: int) -> None:
        self.read, self.plan, self.depth = read, plan, depth
        self._queue: queue.Queue[tuple[Key, np.ndarray | BaseException]] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.misses = 0   # steps read in the loop because the thread had other rows

    def rows(self, step: int) -> np.ndarray:
        """This rank's rows of ``step``: from the thread when it read them, else read now."""
        start, count = self.plan(step)
        key = (step, start, count)
        if self.depth and self._queue is not None:
            got, rows = self._queue.get()
            if got == key:
                if isinstance(rows, BaseException):
                    raise rows
                return rows
        if self.depth:
            self.misses += self._queue is not None
            self.close()   # the source is read by one thread at a time
        rows = self.read(start, count)
        if self.depth:
            self._restart(step + 1)
        return rows

    def _restart(self, step: int) -> None:
        self.close()
        self._stop = threading.Event()
        self._queue = queue.Queue(maxsize=self.depth)
        self._thread = threading.Thread(target=self._run, args=(step, self._queue, self._stop),
                                        name="mlxops-prefetch", daemon=True)
        self._thread.start()

    def _run(self, step: int, out: queue.Queue, stop: threading.Event) -> None:
        while not stop.is_set():
            start, count = self.plan(step)
            try:
                item: np.ndarray | BaseException = self.read(start, count)
            except BaseException as exc:  # raised in the loop when it asks for this step
                item = exc
            while not stop.is_set():
                try:
                    out.put(((step, start, count), item), timeout=0.1)
                    break
                except queue.Full:
                    continue
            if isinstance(item, BaseException):
                return
            step += 1

    def close(self) -> None:
        """Stop the thread (it exits within 0.1 s; it is a daemon either way)."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread, self._queue = None, None
