"""What the watchdog hears: one watch channel per host of a job, and what to do when one is
lost.

Policy:

* Each host runs ``python -m mlxops.node watch`` (:mod:`mlxops.node.watch`) on one
  long-lived SSH channel; it sends the host's whole ``status`` answer at once when a rank
  starts, exits or vanishes, and at least every ``BEAT`` seconds. The watchdog decides on
  every message, so a death reaches it a tick and a network trip after it happened.
* Between messages, the last answer of a host grows older by the controller's own clock
  (:func:`aged`): the heartbeat ages of its live ranks grow by the seconds since it came.
  Those are durations, so clocks that differ between Macs still do not matter, and a
  rank whose node went silent is still found stalled after ``stall_timeout``.
* A lost channel (it ended, broke, or said nothing for ``LOST_AFTER`` seconds: a Mac
  asleep keeps its TCP connection but answers nothing) is a missed poll, never a death:
  the host is asked again with the ``status`` command. Its answer counts as a message, and
  the channel is opened again; no answer makes the host unreachable (as a failed poll
  did), and it is asked again every ``retry`` seconds.
* Once the watchdog has decided to stop the job, :meth:`Channels.stop_ranks` asks every
  helper still heard to stop its ranks at once: it is already running on the node, so the
  ranks get their SIGTERM without a new SSH session and Python start-up per host (most of
  a second on nodes whose cores the ranks keep busy). The ``stop`` command follows anyway
  (:func:`mlxops.jobs.stop.stop_job`), and is what verifies that nothing runs.
* As in :func:`mlxops.transport.run_parallel`, only what a host can cause is a host's
  failure: any other exception in a host's thread (a bug) is raised by :meth:`Channels.wait`
  as :class:`~mlxops.errors.InternalError`.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

from mlxops.errors import InternalError
from mlxops.jobs.record import JobRecord
from mlxops.node import protocol
from mlxops.node.protocol.channel import ChannelRequest, parse_message
from mlxops.node.protocol.commands import LOST_AFTER
from mlxops.transport import Connector, nodecmd
from mlxops.transport.executor import failure_result

#: Seconds a ``status`` ask of a host whose channel was lost may take.
ASK_TIMEOUT = 30.0


@dataclass
class Heard:
    """A host's status answer: from its channel (``changed``: what moved), or asked again."""

    host: str
    answer: protocol.StatusAnswer
    changed: list[int | str]
    at: float                            # the controller's time.monotonic() on receipt
    asked: bool = False                  # the answer of a status ask, after a lost channel


@dataclass
class Lost:
    """A host's channel ended, broke or went silent: the host is asked again."""

    host: str
    reason: str


@dataclass
class Unheard:
    """A host that did not answer when asked: unreachable, as a failed poll."""

    host: str
    reason: str


@dataclass
class Bug:
    host: str
    error: BaseException


Event = Heard | Lost | Unheard | Bug


def aged(answer: protocol.StatusAnswer, seconds: float) -> protocol.StatusAnswer:
    """``answer`` as it would read ``seconds`` later had nothing changed: the heartbeat
    of every live rank (and the launcher's age) that much older, every ended rank ended
    that much longer ago."""
    if seconds <= 0:
        return answer

    def older(value: float | None) -> float | None:
        return None if value is None else value + seconds

    ranks = [dataclasses.replace(
        r, heartbeat_age=older(r.heartbeat_age) if r.alive else r.heartbeat_age,
        ended_ago=older(r.ended_ago)) for r in answer.ranks]
    launcher = answer.launcher
    if launcher is not None:
        launcher = dataclasses.replace(
            launcher, age=older(launcher.age) if launcher.alive else launcher.age,
            ended_ago=older(launcher.ended_ago))
    return dataclasses.replace(answer, now=answer.now + seconds, ranks=ranks,
                               launcher=launcher)


class Channels:
    """A job's channels, one thread per host, and the latest word from each host."""

    def __init__(self, record: JobRecord, connector: Connector, hosts: dict[str, Any], *,
                 retry: float = 1.0, lost_after: float = LOST_AFTER) -> None:
        self.record = record
        self.retry = retry
        self.lost_after = lost_after
        self.events: queue.Queue[Event] = queue.Queue()
        self.heard: dict[str, Heard] = {}
        self.unreachable: dict[str, str] = {}
        self._closed = threading.Event()
        self._streams: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._follow, args=(connector, hosts[h.name]),
                                          name=f"mlxops-watch-{h.name}", daemon=True)
                         for h in record.hosts]
        for thread in self._threads:
            thread.start()

    # --- the watchdog's side -------------------------------------------------------------

    def wait(self, timeout: float) -> list[Event]:
        """Every event that came, after waiting up to ``timeout`` seconds for the first."""
        got: list[Event] = []
        try:
            got.append(self.events.get(timeout=max(0.0, timeout)))
            while True:
                got.append(self.events.get_nowait())
        except queue.Empty:
            pass
        bugs = {}
        for event in got:
            if isinstance(event, Heard):
                self.heard[event.host] = event
                self.unreachable.pop(event.host, None)
            elif isinstance(event, Unheard):
                self.unreachable[event.host] = event.reason
                self.heard.pop(event.host, None)
            elif isinstance(event, Bug):
                bugs[event.host] = event.error
        if bugs:
            raise InternalError(bugs)
        return got

    def wait_all(self, timeout: float) -> None:
        """Until every host has answered or been found unreachable (or ``timeout``)."""
        deadline = time.monotonic() + timeout
        while not self.complete() and time.monotonic() < deadline:
            self.wait(deadline - time.monotonic())

    def complete(self) -> bool:
        return all(h.name in self.heard or h.name in self.unreachable
                   for h in self.record.hosts)

    def answers(self, now: float | None = None) -> dict[str, protocol.StatusAnswer]:
        """Each host's last answer, aged to ``now`` (the controller's monotonic clock)."""
        now = time.monotonic() if now is None else now
        return {host: aged(h.answer, now - h.at) for host, h in self.heard.items()}

    def stop_ranks(self, grace: float) -> None:
        """Ask each open channel's helper to stop its host's ranks now (SIGTERM, SIGKILL
        after ``grace``); returns at once."""
        request = ChannelRequest(stop=grace).line()
        with self._lock:
            streams = list(self._streams.values())
        for stream in streams:
            stream.send(request)

    def close(self) -> None:
        """End every channel (each helper sees its stdin end and exits). Does not wait for
        the threads: one may be asking a host that does not answer, and the watchdog must
        not wait for that to stop the ranks; they end when their ask does."""
        self._closed.set()
        with self._lock:
            streams = list(self._streams.values())
        for stream in streams:
            stream.close()

    def __enter__(self) -> Channels:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- one thread per host ---------------------------------------------------------------

    def _follow(self, connector: Connector, host: Any) -> None:
        name = host.name
        h = self.record.host(name)
        paths = h.paths(self.record.name)
        try:
            while not self._closed.is_set():
                try:
                    self._listen(connector.connect(host), name, h.python, paths)
                    reason = "the channel ended"
                except Exception as exc:  # noqa: BLE001 - sorted: a host's failure, or a bug
                    if self._closed.is_set():
                        return  # closed under it: not a failure
                    reason = self._failure(name, exc)
                if self._closed.is_set():
                    return
                # A lost channel is a missed poll: ask the host again, as a poll would.
                self.events.put(Lost(name, reason))
                self._ask(connector, host, h.python, paths)
                self._closed.wait(self.retry)
        except _BugSeen:
            return

    def _listen(self, conn: Any, name: str, python: str, paths: Any) -> None:
        command = nodecmd.node_command(python, paths.code,
                                       protocol.watch_args(paths.run_dir))
        stream = conn.stream(command)
        with self._lock:
            self._streams[name] = stream
        try:
            while not self._closed.is_set():
                line = stream.read_line(self.lost_after)
                if line is None:
                    return
                try:
                    message = parse_message(line)
                except protocol.ProtocolError as exc:
                    raise nodecmd.NodeCommandError(f"{name}: watch: {exc}") from None
                self.events.put(Heard(name, message.status, list(message.changed),
                                      time.monotonic()))
        finally:
            with self._lock:
                self._streams.pop(name, None)
            stream.close()

    def _ask(self, connector: Connector, host: Any, python: str, paths: Any) -> None:
        try:
            answer = nodecmd.run_node(connector.connect(host), python, paths.code,
                                      protocol.status_args(paths.run_dir), timeout=ASK_TIMEOUT)
        except Exception as exc:  # noqa: BLE001 - sorted: a host's failure, or a bug
            self.events.put(Unheard(host.name, self._failure(host.name, exc)))
            return
        self.events.put(Heard(host.name, answer, [], time.monotonic(), asked=True))

    def _failure(self, name: str, exc: Exception) -> str:
        if isinstance(exc, TimeoutError):
            return f"channel silent: {exc}"
        result = failure_result(name, exc)
        if result is None:
            self.events.put(Bug(name, exc))
            raise _BugSeen from exc
        return result.message


class _BugSeen(Exception):
    """Ends a host's thread after it reported a bug."""
