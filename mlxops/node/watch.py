"""The ``watch`` command: a job's ranks reported as they change, on one long-lived channel
(:mod:`mlxops.node.protocol.channel`; docs/node-protocol.md).

Every ``tick`` seconds it takes a *look* at the run directory: per rank (and launcher) the
pid file, the exit file and whether the process it names is alive, which costs a few
``stat`` calls and a signal 0, not the process table that a ``status`` answer reads. When a
look differs from the last one (a rank started, wrote its exit code, vanished), it sends the
whole ``status`` answer at once, naming what changed; otherwise it sends it every ``beat``
seconds (the heartbeats the trainer wrote since, and a sign of life). A heartbeat alone
does not make a message: the trainer rewrites it up to twice a second per rank, and the
watchdog ages the last answer by its own clock between messages.

Its stdin carries the controller's requests, one line each
(:class:`~mlxops.node.protocol.channel.ChannelRequest`): ``stop`` stops every rank here at
once, as the ``stop`` command does. It ends when its stdin ends (the controller closed the
channel, or its SSH session went), after the requests that came before, or when its
stdout is closed.
"""

from __future__ import annotations

import os
import select
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from mlxops.node import protocol
from mlxops.node.host import has_proc
from mlxops.node.protocol.channel import ChannelMessage, ChannelRequest, parse_request
from mlxops.node.protocol.commands import BEAT, TICK
from mlxops.node.rundir import has_launcher, process_path, ranks_in, read_int
from mlxops.node.status import status
from mlxops.node.stop import stop

Look = dict[int | str, tuple]


def _stat_key(path: Path) -> tuple[int, int] | None:
    """What changes when a file is written anew (replaced or rewritten)."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


def probe(pid: int | None) -> bool | None:
    """Whether ``pid``'s process group (or, for a rank mpirun started, the process) can be
    signalled and its leader is not a zombie; None without a pid."""
    if pid is None:
        return None
    for signal_it in (os.killpg, os.kill):
        try:
            signal_it(pid, 0)
            break
        except ProcessLookupError:
            continue
        except PermissionError:
            break
    else:
        return False
    if has_proc():  # a leader that ended but was not reaped yet still takes signal 0
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return True  # the leader went, its group lives on (the pid answered signal 0)
        return state != "Z"
    return True


def look(run_dir: Path) -> Look:
    """Per rank (and LAUNCHER): the pid file, the exit file, and whether it is alive."""
    keys: list[int | str] = list(ranks_in(run_dir))
    if has_launcher(run_dir):
        keys.append(protocol.LAUNCHER)
    found: Look = {}
    for key in keys:
        pid_file = process_path(run_dir, key, protocol.PID)
        found[key] = (_stat_key(pid_file), _stat_key(process_path(run_dir, key, protocol.EXIT)),
                      probe(read_int(pid_file)))
    return found


def changed(before: Look, after: Look) -> list[int | str]:
    """The keys whose look differs, ranks by number first, then LAUNCHER."""
    keys = set(before) | set(after)
    return sorted((k for k in keys if before.get(k) != after.get(k)),
                  key=lambda k: (isinstance(k, str), 0 if isinstance(k, str) else k))


def watch(run_dir: Path, *, tick: float = TICK, beat: float = BEAT,
          stdin: IO[bytes] | None = None, out: IO[str] | None = None,
          clock: Callable[[], float] = time.monotonic) -> int:
    """Send messages on ``out`` (stdout) until ``stdin`` ends or ``out`` is closed, and do
    what the requests on ``stdin`` ask; 0."""
    stdin = stdin if stdin is not None else sys.stdin.buffer
    out = out if out is not None else sys.stdout
    requests = _Requests(stdin)
    last: Look = {}
    sent_at = float("-inf")
    seq = 0
    while True:
        now_look = look(run_dir)
        moved = changed(last, now_look) if seq else []
        if moved or clock() - sent_at >= beat:
            message = ChannelMessage(seq=seq, changed=moved, status=status(run_dir))
            try:
                out.write(message.line())
                out.flush()
            except (BrokenPipeError, ValueError):  # ValueError: written to a closed file
                return 0
            last, sent_at, seq = now_look, clock(), seq + 1
        for request in requests.wait(tick):
            if request.stop is not None:
                stop(run_dir, request.stop)
        if requests.ended:
            return 0


class _Requests:
    """The controller's request lines on stdin, and whether it ended."""

    def __init__(self, stdin: IO[bytes]) -> None:
        self._stdin = stdin
        self._buffer = b""
        self.ended = False

    def wait(self, seconds: float) -> list[ChannelRequest]:
        """The requests that came within ``seconds`` (at once if one did)."""
        try:
            ready, _, _ = select.select([self._stdin], [], [], seconds)
        except (ValueError, OSError):
            self.ended = True
            return []
        if not ready:
            return []
        try:
            data = os.read(self._stdin.fileno(), 4096)
        except OSError:
            data = b""
        if not data:
            self.ended = True
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        found = []
        for line in lines:
            try:
                found.append(parse_request(line.decode(errors="replace")))
            except protocol.ProtocolError as exc:
                sys.stderr.write(f"mlxops.node watch: {exc}\n")  # not for this version
        return found
