"""A job's timeline: what happened to it, when, one JSON line each (``mlxops events NAME``).

Kept on the controller beside the job's record, ``<controller home>/jobs/<name>/events.jsonl``
(docs/formats.md, "events.jsonl"). Whoever does the thing writes its line, at the moment
it is done: the ``launch``/``resume``/``stop`` commands, the watchdog (a stall it found, a
restart and its reason, the end), the watchdog's metrics feeder (an alert crossed, a
validation loss that stopped improving), the notifier (each notification sent or given
up). The dashboard and the report draw the timeline as markers; the notifier reads it to
know what to deliver (:mod:`mlxops.notify`).

The policy:

* **Append-only, one ``write`` per line** (``O_APPEND``): writers in several processes
  never interleave a line, and a reader never needs a lock.
* **A torn line costs only itself.** A writer killed mid-write leaves a last line without
  its newline; the next append starts on a new line (else it would be glued to the torn
  one and lost with it: a lost ``failed`` is a notification never sent), and a reader
  skips the torn line and says so (:func:`read`'s ``on_skip``).
* **One run per file**: a fresh launch of the name (not a resume, not a restart) starts the
  file over (:func:`start_run`), so a timeline is one run's from its launch.
* **Every event has an id** (unique, never reused): what the notifier keys "delivered
  once" on.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlxops.node.protocol.decode import ProtocolError, Record
from mlxops.paths import controller_home

FILE = "events.jsonl"

# The kinds, in the words notifications and the timeline use (docs/formats.md).
STARTED = "started"          # a fresh launch: every rank started
RESUMED = "resumed"          # `mlxops resume` (detail: excluded hosts, the step)
STALLED = "stalled"          # the watchdog found a rank without progress
RESTARTED = "restarted"      # the watchdog stopped and resumed the job (detail: reason)
NEEDS_REBOOT = "needs_reboot"  # a rank survived SIGKILL (a wedged GPU): its node is left out
STOPPED = "stopped"          # `mlxops stop`
FAILED = "failed"            # the job ended for good (detail: why)
FINISHED = "finished"        # every rank finished
ALERT = "alert"              # a threshold of the job's `alerts:` was crossed
PLATEAU = "plateau"          # validation loss stopped improving (the trainer's patience)
NOTIFIED = "notified"        # a notification was delivered (detail: the event, the target)
NOTIFY_FAILED = "notify_failed"  # ... or given up after its retries

#: What a notification can be sent for (a job's ``notify.events``).
NOTIFIABLE = (STARTED, RESUMED, STALLED, RESTARTED, NEEDS_REBOOT, STOPPED, FAILED, FINISHED,
              ALERT, PLATEAU)
KINDS = (*NOTIFIABLE, NOTIFIED, NOTIFY_FAILED)


@dataclass(frozen=True)
class Event(Record):
    """One line of ``events.jsonl``."""

    id: str
    time: float                  # seconds since the epoch
    job: str
    kind: str                    # one of KINDS
    message: str                 # one line for a person ("rank 1 on mac2 exited ...")
    attempt: int | None = None   # the job's attempt when it happened, when known
    detail: dict[str, Any] = field(default_factory=dict)  # the kind's own values


def path(name: str) -> Path:
    return controller_home() / "jobs" / name / FILE


def make(name: str, kind: str, message: str, *, attempt: int | None = None,
         now: float | None = None, **detail: Any) -> Event:
    if kind not in KINDS:
        raise ValueError(f"unknown event kind {kind!r}")
    return Event(id=uuid.uuid4().hex[:16], time=round(time.time() if now is None else now, 3),
                 job=name, kind=kind, message=message, attempt=attempt, detail=detail)


def _line(event: Event) -> bytes:
    return (json.dumps(event.to_dict(), separators=(",", ":")) + "\n").encode()


def _ends_torn(fd: int) -> bool:
    """Whether the file open at ``fd`` ends inside a line (a writer killed mid-write)."""
    size = os.fstat(fd).st_size
    return size > 0 and os.pread(fd, 1, size - 1) != b"\n"


def append(event: Event) -> Event:
    """Add ``event`` to its job's timeline (one ``write`` with ``O_APPEND``), on a line of
    its own even after a torn one. Writers take the file's lock for the look and the write
    (a line being written by another process would look torn); readers take none."""
    target = path(event.job)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(target, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, (b"\n" if _ends_torn(fd) else b"") + _line(event))
    finally:
        os.close(fd)
    return event


def record(name: str, kind: str, message: str, **values: Any) -> Event:
    """Make and append an event: ``record(name, RESTARTED, reason, attempt=2)``."""
    return append(make(name, kind, message, **values))


def start_run(event: Event) -> Event:
    """A fresh launch: the timeline starts over with ``event`` (written whole, atomically)."""
    target = path(event.job)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{FILE}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, _line(event))
    finally:
        os.close(fd)
    os.replace(tmp, target)
    return event


#: Told of each line skipped: its number (from 1) and the line, cut to 80 characters.
OnSkip = Callable[[int, str], None]


def parse(text: str, on_skip: OnSkip | None = None) -> list[Event]:
    """The events of well-formed lines; a torn or foreign line is skipped, and
    ``on_skip`` told of it (empty lines are passed over silently)."""
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(Event.from_dict(json.loads(line)))
        except (ValueError, ProtocolError):
            if on_skip is not None:
                on_skip(number, line[:80])
    return out


def read(name: str, on_skip: OnSkip | None = None) -> list[Event]:
    """The job's timeline, oldest first; empty when it has none yet."""
    try:
        return parse(path(name).read_text(errors="replace"), on_skip)
    except FileNotFoundError:
        return []


def skip_note(name: str) -> OnSkip:
    """An ``on_skip`` for a command's stderr: one line per skipped line, naming the file."""
    def note(number: int, line: str) -> None:
        print(f"mlxops: {path(name)}: line {number} is not an event (torn by a crash?), "
              f"skipped: {line!r}", file=sys.stderr)
    return note
