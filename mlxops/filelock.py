"""Advisory locks on the controller's files (``flock``): one holder at a time.

The job record's writers, the one watchdog per job and the one metrics feeder per job each
hold one; a lock is released when its holder exits, however it exits, so a killed
controller never leaves a stale one behind.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def exclusive(path: Path, *, wait: bool = True, note_pid: bool = False) -> Iterator[bool]:
    """Hold ``path`` locked; yields True, or False at once when another holder has it and
    ``wait`` is False. ``note_pid`` writes the holder's pid into the file (for a person
    looking for the process)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w" if note_pid else "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        if note_pid:
            handle.write(f"{os.getpid()}\n")
            handle.flush()
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
