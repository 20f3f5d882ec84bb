"""The watchdog's look at a serve job's server: one greedy one-token completion, sent
through mlxops's SSH connection to rank 0's host (the server listens on the node's
loopback), answered within ``serve.probe_timeout`` or the server counts as hung.

A process that died is the rank machinery's to see (its exit code); the probe sees what
only a request shows: a server that runs but does not answer (hung), or stopped answering
(its listener gone), or never started to within ``serve.start_timeout`` (a model that
does not load in time), or whose host no longer answers at all (a Mac asleep: the
probe's channel is not opened within ``serve.probe_timeout``). A server writes no
heartbeat, so the probe is what notices a node that fell asleep under a serve job, within
``probe_timeout`` of the probe sent after it did.

The figures ``mlxops status``, ``monitor`` and the dashboard show for a serve job
(:class:`ServeFigures`): latency, the last probe's round trip; tokens/s, a greedy
:data:`CANARY_TOKENS`-token completion's, sent every :data:`CANARY_EVERY` seconds (a
measure of the server's speed now, not of its clients' traffic); requests, the requests
its log says it answered this attempt (counted on the node, :mod:`mlxops.node.serverlog`)
less the watchdog's own.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from mlxops.jobs.servespec import ServeSpec
from mlxops.node.protocol.serve import PROBE_PATH, PROBE_REQUEST
from mlxops.transport import Connection
from mlxops.transport.forward import http_exchange

CANARY_TOKENS = 16
CANARY_EVERY = 30.0  # seconds
# Timeouts in a row with the request count read and unchanged that make a server hung.
# Two, not one: mlx-lm's handler writes a request's log line (what the node counts) only
# once the request's answer starts, so a long request just taken on by a slow node is
# not counted yet at the first timeout behind it (a CI run restarted such a server
# mid-request); a stopped server is still restarted at the second probe.
UNCHANGED_TIMEOUTS = 2


def serve_address(serve: ServeSpec) -> str:
    """Where the server is reached from its own host: its bind address, the loopback for
    a wildcard one."""
    return "127.0.0.1" if serve.bind in ("0.0.0.0", "::") else serve.bind


@dataclass
class ProbeResult:
    ok: bool
    seconds: float | None = None        # the round trip of an answer
    refused: bool = False               # nothing listens (yet, or any more)
    hung: bool = False                  # connected, no whole answer in time
    unreached: bool = False             # its host did not answer (asleep, off the network)
    error: str = ""
    tokens_per_sec: float | None = None  # tokens of the answer over its round trip


@dataclass
class ServeFigures:
    """A serve job's live figures: the one record of them that ``status --json``, the
    watchdog and the mirror's ``samples.jsonl`` (its ``serve`` key) share."""

    latency: float | None = None         # seconds: the last one-token probe's round trip
    tokens_per_sec: float | None = None  # the last canary's
    requests: int | None = None          # answered this attempt, the watchdog's not counted

    KEY: ClassVar[str] = "serve"         # where a status or a sample line holds them

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def probe(conn: Connection, serve: ServeSpec, tokens: int = 1) -> ProbeResult:
    """One probe of the server on ``conn``'s host (never raises for the server's sake;
    an unreachable host raises as every transport call does). ``tokens``: more than one
    for the canary (``tokens_per_sec`` of its answer)."""
    try:
        stream = conn.open_tunnel(serve_address(serve), serve.port, serve.probe_timeout)
    except ConnectionRefusedError as exc:
        return ProbeResult(False, refused=True, error=str(exc))
    try:
        answer = http_exchange(stream, "POST", PROBE_PATH,
                               {**PROBE_REQUEST, "max_tokens": tokens},
                               timeout=serve.probe_timeout)
    except TimeoutError as exc:
        return ProbeResult(False, hung=True, error=str(exc))
    except OSError as exc:
        # sshd accepted the channel, then the connection was refused or reset on its side
        return ProbeResult(False, refused=True, error=f"{type(exc).__name__}: {exc}")
    finally:
        stream.close()
    if answer.status != 200:
        return ProbeResult(False, answer.seconds, error=f"HTTP {answer.status}: "
                                                        f"{answer.body[:200]!r}")
    try:
        made = int(answer.json()["usage"]["completion_tokens"])
    except (ValueError, KeyError, TypeError):
        made = None
    return ProbeResult(True, answer.seconds,
                       tokens_per_sec=made / answer.seconds if made and answer.seconds else None)


@dataclass
class ProbeWatch:
    """The probes of one attempt, and the problem they add up to (or None)."""

    serve: ServeSpec
    host: str
    started: float = field(default_factory=time.monotonic)
    answered: int = 0                   # probes answered this attempt
    last: ProbeResult | None = None
    canary: ProbeResult | None = None    # the last canary answered
    canary_at: float = float("-inf")     # when it was sent (monotonic)
    # The server's request count (its log's, the node's count) when a probe was last
    # answered, and the probes timed out in a row since: what tells busy from hung.
    counted: int | None = None
    timeouts: int = 0
    # At the last timeout: True the count moved (busy), False it did not, None not known.
    moved: bool | None = None
    unchanged: int = 0                  # timeouts in a row with the count read and unchanged

    def look(self, conn: Connection, now: float | None = None,
             count: Callable[[], int | None] = lambda: None) -> str | None:
        """Probe, and every :data:`CANARY_EVERY` seconds of answers also a canary;
        the problem, or None. ``count``: the server's request count now (asked only when
        a probe timed out)."""
        now = time.monotonic() if now is None else now
        result = probe(conn, self.serve)
        problem = self.problem(result, now, count() if result.hung else None)
        if problem is None and self.answered and now - self.canary_at >= CANARY_EVERY:
            self.canary_at = now
            canary = probe(conn, self.serve, tokens=CANARY_TOKENS)
            if canary.ok:
                self.answered += 1
                self.canary = canary
        return problem

    def figures(self, requests: int | None, own: int | None = None) -> ServeFigures:
        """``requests``: what the node counted in the server's log this attempt, when the
        watchdog's own answered requests were ``own`` (default: all so far)."""
        latency = self.last.seconds if self.last is not None and self.last.ok else None
        return ServeFigures(
            latency=latency,
            tokens_per_sec=self.canary.tokens_per_sec if self.canary else None,
            requests=None if requests is None else
            max(0, requests - (self.answered if own is None else own)))

    def busy(self) -> str:
        """What the watchdog says of a probe that timed out without the server being hung
        (yet): why it is taken for busy."""
        behind = {True: "behind requests it started since",
                  None: "(its request count not read in time)",
                  False: "(its request count not moved yet: a request is logged once its "
                         "answer starts)"}[self.moved]
        return (f"the server on {self.host} is busy: the probe waited "
                f"{self.serve.probe_timeout:g}s {behind} (not hung; {self.timeouts} of "
                f"{self.serve.hung_probes} in a row)")

    def unreachable(self, reason: str) -> str:
        """The problem when the probe could not get through to the server's host: a Mac
        asleep keeps its TCP connection and answers nothing (the probe's channel is not
        opened within ``probe_timeout``), one off the network refuses. To the server's
        clients that is a server down, so it is restarted as a hung one is: the restart
        reaches the host again once it wakes (or goes on without it, per the job's
        ``restart.exclude_unreachable``)."""
        self.last = ProbeResult(False, unreached=True, error=reason)
        return f"the server on {self.host} could not be probed: {self.host} not answering " \
               f"({reason})"

    def answered_at(self, requests: int | None) -> None:
        """The request count read after an answered probe: the next timeout's baseline."""
        if isinstance(requests, int):
            self.counted = requests

    def problem(self, result: ProbeResult, now: float | None = None,
                requests: int | None = None) -> str | None:
        """``requests``: the server's request count when ``result`` timed out (None: not
        known). A probe that timed out while the server started other requests since the
        last answered one (a long generation ahead of it: mlx-lm serves a request with a
        ``seed`` alone) is busy, not hung, until ``serve.hung_probes`` time out in a row.
        A count not known (its node too busy to say within the watchdog's wait, as a node
        generating for a long request is) says nothing either way: such timeouts are
        judged by ``serve.hung_probes`` in a row alone. Only a count read and unchanged at
        :data:`UNCHANGED_TIMEOUTS` timeouts in a row is hung sooner (a stopped server: its
        node answers at once)."""
        self.last = result
        if result.ok:
            self.answered += 1
            self.timeouts = self.unchanged = 0
            return None
        server = f"the server on {self.host}"
        if result.hung:
            self.timeouts += 1
            known = requests is not None and self.counted is not None
            self.moved = (requests > self.counted) if known else None
            self.unchanged = self.unchanged + 1 if self.moved is False else 0
            if (self.unchanged < UNCHANGED_TIMEOUTS
                    and self.timeouts < self.serve.hung_probes):
                return None   # busy (or not known yet): requests ahead of the probe
            why = (f"{self.timeouts} probes in a row" if self.moved is not False else
                   f"{self.unchanged} in a row, and its request count has not moved since "
                   f"the last answer")
            return (f"{server} did not answer a one-token completion in "
                    f"{self.serve.probe_timeout:g}s, {why} (hung)")
        if self.answered:
            return f"{server} stopped answering ({result.error})"
        waited = (time.monotonic() if now is None else now) - self.started
        if result.refused and waited <= self.serve.start_timeout:
            return None  # still loading its model
        return (f"{server} did not answer in {waited:.0f}s since its start "
                f"(serve.start_timeout {self.serve.start_timeout:g}s): {result.error}")


def look_once(serve: ServeSpec, conn: Connection, requests: int | None) -> ServeFigures:
    """One probe's figures, for ``mlxops status`` (no watchdog: no canary, and the
    requests counted include every probe sent)."""
    result = probe(conn, serve)
    return ServeFigures(latency=result.seconds if result.ok else None, requests=requests)
