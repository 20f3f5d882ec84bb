"""The watchdog: follow a job, and stop + resume it when a rank dies, vanishes or stalls.

MLX collectives have no timeout: when one rank dies or hangs, every other rank waits in
its all-reduce forever. Only something outside the ranks can notice, and only killing the
process groups frees their ports (and, on a Mac, their GPU memory). That is this loop. It
does not poll: each host's watch channel (:mod:`mlxops.jobs.channel`) tells it of a rank's
exit as it happens, and it decides on every message (the one classification of a rank's
state is :func:`mlxops.jobs.status.classify`).

A restart never undoes a user's ``mlxops stop`` (see :mod:`mlxops.jobs.record`): under
the record lock the watchdog checks that the job was not stopped before it starts a new
attempt, and the new attempt's record is refused if a stop came while its ranks were
starting, in which case the watchdog stops what it just started. A restart runs the job
as launched (kept in the record), not the job file as it reads now.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable

from mlxops import events
from mlxops.errors import InternalError, MlxopsError
from mlxops.jobs import wedged
from mlxops.jobs.channel import ASK_TIMEOUT, Channels, Heard, Lost
from mlxops.jobs.jacclinit import jaccl_init_failure
from mlxops.jobs.launch import launch
from mlxops.jobs.policy import not_restarted
from mlxops.jobs.record import (
    JobRecord,
    JobStopped,
    Restart,
    inventory_hosts,
    load_record,
    update,
)
from mlxops.jobs.serveprobe import ProbeWatch
from mlxops.jobs.spec import JobSpec
from mlxops.jobs.status import PEER_LOST, JobStatus, classify, job_status
from mlxops.jobs.stop import reap_strays, stop_job
from mlxops.node.protocol import FAILED, FINISHED, RUNNING, STALLED, STOPPED
from mlxops.transport import Connector, GroupError, HostUnreachable

OnStatus = Callable[[JobStatus], None]
STRAY_RETRY = 30.0  # seconds between attempts to reach a host the job left behind
#: Seconds beyond the stop's grace that the watchdog waits for the ranks of a job stopped
#: elsewhere to be gone (SIGKILL and the check that they went, on a slow node).
STOP_SETTLE = 10.0
#: Seconds the watchdog waits to hear the rank that died first when it has heard only of
#: ranks that lost their peer (they exit as fast as it does; another host's channel may be
#: a moment behind).
PEER_GRACE = 1.0
OnEvent = Callable[[str], None]


def restart(record: JobRecord, connector: Connector, reason: str,
            on_event: OnEvent = lambda _: None) -> JobRecord:
    """Stop every rank, record why, and resume from the newest common checkpoint.

    Raises :class:`JobStopped` when ``mlxops stop`` stopped the job meanwhile: before the
    new attempt starts (nothing is started), or while its ranks were starting (they are
    stopped again here). Either way nothing of the job runs afterwards.
    """
    spec = record.job_spec()  # the job as launched: refused before anything is stopped
    on_event(f"restarting ({reason})")
    stuck = wedged.survived_kill(stop_job(record, connector, mark_stopped=False))
    entry = Restart(time=time.time(), reason=reason, attempt=record.attempt)

    def begin(current: JobRecord) -> None:
        if current.state == STOPPED:
            raise JobStopped(current)
        current.restarts.append(entry)
        wedged.mark(current, stuck)

    previous = update(record.name, begin)
    for message in wedged.tell(record.name, record.attempt, stuck):
        on_event(message)
    try:
        return _relaunch(spec, previous, connector, on_event)
    except JobStopped as exc:
        on_event("stopped (mlxops stop) while the ranks were starting: stopping them again")
        stop_job(exc.record, connector, mark_stopped=False)
        raise
    except MlxopsError as exc:
        if not stuck:
            raise
        raise MlxopsError(wedged.cannot_go_on(stuck, exc)) from None


def _relaunch(spec: JobSpec, previous: JobRecord, connector: Connector,
              on_event: OnEvent) -> JobRecord:
    try:
        return launch(spec, connector, resume=True, exclude=wedged.excluded(previous),
                      previous=previous, on_warning=on_event)
    except GroupError as exc:
        gone = exc.results.unreachable
        if not (previous.restart.exclude_unreachable and gone):
            raise
    # A Mac that is down (powered off, asleep, off the network) need not end the run:
    # go on without it, same global batch, from the newest checkpoint the rest share.
    on_event(f"continuing without {', '.join(gone)} (unreachable)")
    new = launch(spec, connector, resume=True, exclude=[*wedged.excluded(previous), *gone],
                 previous=previous, on_warning=on_event)
    left = [previous.host(h) for h in gone]

    def add_strays(current: JobRecord) -> None:
        current.stray += [h for h in left if h.name not in {s.name for s in current.stray}]

    new.stray = update(new.name, add_strays).stray
    return new


def _once_stopped(name: str, connector: Connector, hosts: dict | None) -> JobStatus:
    """The job's status once a stop recorded elsewhere (``mlxops stop``) has stopped its
    ranks: the stop records the job as stopped before it signals them, so a status read at
    once may still see them running. Waits up to the stop's grace + :data:`STOP_SETTLE`."""
    deadline = time.monotonic() + load_record(name).stop_grace + STOP_SETTLE
    while True:
        status = job_status(load_record(name), connector, hosts=hosts)
        if status.state not in (RUNNING, STALLED) or time.monotonic() > deadline:
            return status
        time.sleep(0.25)


def _end(name: str, state: str, message: str) -> None:
    """Record how the job ended, unless the user stopped it meanwhile (that stays)."""
    def end(current: JobRecord) -> None:
        if current.state != STOPPED:
            current.state, current.message = state, message

    ended = update(name, end)
    if ended.state == state:
        events.record(name, events.FAILED if state == FAILED else events.FINISHED, message,
                      attempt=ended.attempt)


def _finished(current: JobRecord) -> None:
    current.state = FINISHED  # every rank finished: true even if a stop came meanwhile


def supervise(record: JobRecord, connector: Connector, *, on_status: OnStatus = lambda _: None,
              on_event: OnEvent = lambda _: None, poll: float | None = None) -> JobStatus:
    """Watch until the job finishes, fails for good, or is stopped; restart on problems.

    The watchdog hears each host on its watch channel (:mod:`mlxops.jobs.channel`) and
    decides on every message, and at least every ``poll`` seconds (default: the job's
    ``restart.interval``) so that silence ages the heartbeats it last heard.

    ``on_status`` gets every status: the terminal's progress bar, and the metrics
    mirror's :class:`~mlxops.monitor.mirror.Feeder` (the monitor sits above the jobs, so
    whoever starts the watchdog passes its feeder in).
    """
    hosts = inventory_hosts(record)
    unreachable_since: dict[str, float] = {}
    reaper = _Reaper(connector, on_event)
    channels = _listen(record, connector, hosts)
    quiet: set[str] = set()  # hosts whose channel was lost and has not spoken since
    lost_peer: list[float] = []  # when a peer-lost failure alone was first seen
    probes = _probes(record)
    counts = _Counts(connector, hosts)
    next_probe, figures = 0.0, None
    try:
        while True:
            reaper.poke(record)
            status = classify(record, channels.answers(), dict(channels.unreachable))
            if _awaiting_cause(status, lost_peer):
                # Only ranks that lost a peer have failed so far: the peer that died first is
                # still to be heard (its host's channel a moment behind). Name it, not them.
                channels.wait(PEER_GRACE / 5)
                continue
            probed = None
            if probes is not None and status.state == RUNNING and not status.problem:
                # A serve job's probe, every restart.interval (the channels wake the loop
                # far more often): its figures stand until the next one.
                if time.monotonic() >= next_probe:
                    next_probe = time.monotonic() + record.restart.interval
                    probed = _probe(probes, connector, hosts,
                                    functools.partial(counts.count, record))
                    if probed is None and probes.timeouts:
                        on_event(probes.busy())
                    if probed is None and probes.timeouts == 0:
                        served = counts.read(record)
                        if served is _Counts.LATE:  # its host may be asleep: probe at once
                            next_probe = 0.0
                        elif served is not _Counts.BUSY:
                            probes.answered_at(served)
                            figures = probes.figures(served)
                status.serve = figures
            stopping = status.problem is not None and status.state not in (FINISHED, STOPPED)
            if stopping:  # the ranks stop now, by the helpers on the nodes; the rest follows
                channels.stop_ranks(record.stop_grace)
            on_status(status)  # e.g. the monitor's feeder (monitor.mirror.Feeder.on_status)
            if status.state == FINISHED:
                record.state = update(record.name, _finished).state
                events.record(record.name, events.FINISHED,
                              f"every rank finished (step {status.step})",
                              attempt=record.attempt, step=status.step)
                return status
            if status.state == STOPPED:
                return status  # stopped on purpose (here or by `mlxops stop` elsewhere)
            if load_record(record.name).state == STOPPED:
                # Stopped meanwhile: say how it ends, not what the channels said before.
                return _once_stopped(record.name, connector, hosts)
            if probed and probes is not None and not (probes.last.hung
                                                      or probes.last.unreached):
                # A server that stopped answering has usually died: its rank's exit code, a
                # moment behind, names the cause better than the refused probe does.
                status = job_status(record, connector, hosts=hosts)
            problem = status.problem or _long_unreachable(status, unreachable_since,
                                                          record.restart.stall_timeout) or probed
            if problem:
                stalled = [r for r in status.ranks if r.state == STALLED]
                if stalled:
                    events.record(record.name, events.STALLED, problem, attempt=record.attempt,
                                  ranks=[r.rank for r in stalled], step=status.step)
                if not stopping:
                    channels.stop_ranks(record.stop_grace)
                channels.close()  # the attempt it watched is about to end
                # Causes a restart cannot cure end the job with their own line: bad input
                # (exit 2) and a failed jaccl set-up, never retried in a loop
                # (jobs/policy.py, jobs/jacclinit.py).
                final = (not_restarted(status.ranks)
                         or jaccl_init_failure(status, record.backend))
                if final or len(record.restarts) >= record.restart.max_restarts:
                    stop_job(record, connector, mark_stopped=False)
                    message = final or (f"gave up after {len(record.restarts)} restarts: "
                                        f"{problem}")
                    _end(record.name, FAILED, message)
                    on_event(message)
                    return job_status(load_record(record.name), connector, hosts=hosts)
                ended = record.attempt
                try:
                    record = restart(record, connector, problem, on_event)
                except JobStopped:
                    on_event("stopped (mlxops stop) during the restart: not restarting")
                    return job_status(load_record(record.name), connector, hosts=hosts)
                except MlxopsError as exc:
                    message = f"restart failed: {exc}"
                    _end(record.name, FAILED, message)
                    on_event(message)
                    raise
                unreachable_since.clear()
                quiet.clear()
                probes = _probes(record)
                next_probe, figures = 0.0, None
                events.record(record.name, events.RESTARTED, problem, attempt=ended,
                              excluded=record.excluded, resumed=record.message)
                on_event(f"restarted: attempt {record.attempt}"
                         + (f", {record.message}" if record.message else ""))
                channels = _listen(record, connector, hosts)
                continue
            for event in channels.wait(poll if poll is not None else record.restart.interval):
                if isinstance(event, Lost) and event.host not in quiet:
                    quiet.add(event.host)
                    on_event(f"{event.host}: watch channel lost ({event.reason}): "
                             "asking it again")
                elif isinstance(event, Heard) and not event.asked:
                    quiet.discard(event.host)
    finally:
        channels.close()


class _Reaper:
    """Hosts the job left behind, asked every ``STRAY_RETRY`` seconds whether they are back
    (their old ranks still hold memory and ports there), in a thread of their own: a host
    still asleep costs a connect timeout, and the watchdog must hear its channels meanwhile.
    A bug met there is raised in the watchdog's thread, at its next :meth:`poke`."""

    def __init__(self, connector: Connector, on_event: OnEvent) -> None:
        self.connector, self.on_event = connector, on_event
        self._thread: threading.Thread | None = None
        self._next = 0.0
        self._bug: BaseException | None = None

    def poke(self, record: JobRecord) -> None:
        if self._bug is not None:
            raise self._bug
        busy = self._thread is not None and self._thread.is_alive()
        if not record.stray or busy or time.monotonic() < self._next:
            return
        self._next = time.monotonic() + STRAY_RETRY
        self._thread = threading.Thread(target=self._reap, args=(record,), daemon=True,
                                        name="mlxops-reap-strays")
        self._thread.start()

    def _reap(self, record: JobRecord) -> None:
        try:
            for name in reap_strays(record, self.connector).succeeded:
                self.on_event(f"{name} is back: stopped the ranks it still ran")
        except InternalError as exc:
            self._bug = exc
        except MlxopsError as exc:  # the record or the inventory: said, and tried again later
            self.on_event(f"stopping the ranks left behind: {exc}")


def _listen(record: JobRecord, connector: Connector, hosts: dict) -> Channels:
    """The job's channels, once every host answered or was found unreachable."""
    channels = Channels(record, connector, hosts, retry=record.restart.interval)
    channels.wait_all(ASK_TIMEOUT + record.restart.interval)
    return channels


def _probes(record: JobRecord) -> ProbeWatch | None:
    """The probe of the attempt ``record`` describes, where its workload has one."""
    if record.workload is None or not record.ranks:
        return None
    return record.workload.probe_watch(record.ranks[0].host)


def _probe(probes: ProbeWatch, connector: Connector, hosts: dict,
           count: Callable[[], int | None]) -> str | None:
    """A serve job's probe (:mod:`mlxops.jobs.serveprobe`): its problem, or None. A host
    that cannot be reached is one: the server's clients cannot reach it either, and a
    server writes no heartbeat whose age would tell the watchdog (a sleeping Mac's
    channel is asked again, for up to ASK_TIMEOUT, before the unreachable rule's
    stall_timeout even starts)."""
    try:
        return probes.look(connector.connect(hosts[probes.host]), count=count)
    except HostUnreachable as exc:
        return probes.unreachable(exc.reason)


class _Counts:
    """A serve job's requests count, for its figures: the watch channel does not read the
    server's log, so a status asks it (:func:`job_status`, the node counts), after each
    probe that was answered. Asked in a thread of its own and waited for at most
    :data:`COUNT_WAIT` seconds: a host that falls asleep while it is asked holds the
    watchdog no longer than that (the status would wait out its SSH timeouts, 30 s and
    more), and the next probe, sent at once, finds it. A late answer is dropped (the
    probes sent meanwhile would be counted as the clients'), and no new ask is made while
    one is under way."""

    LATE, BUSY = object(), object()
    COUNT_WAIT = 2.0  # seconds: so a node asleep is found within probe_timeout + 2 s

    def __init__(self, connector: Connector, hosts: dict) -> None:
        self.connector, self.hosts = connector, hosts
        self._thread: threading.Thread | None = None
        self._answer: dict[str, object] = {}

    def count(self, record: JobRecord) -> int | None:
        """The count as a number, None when it is not known now (late, busy, unread)."""
        answer = self.read(record)
        return answer if isinstance(answer, int) else None

    def read(self, record: JobRecord) -> object:
        """Requests rank 0's node counted (None: not known); :attr:`LATE` when this ask
        was not answered in time, :attr:`BUSY` while a late one is still under way."""
        if self._thread is not None and self._thread.is_alive():
            return self.BUSY
        answer: dict[str, object] = {}
        self._answer = answer
        self._thread = threading.Thread(target=self._ask, args=(record, answer), daemon=True,
                                        name="mlxops-serve-count")
        self._thread.start()
        self._thread.join(self.COUNT_WAIT)
        if self._thread.is_alive():
            return self.LATE
        if "bug" in answer:
            raise answer["bug"]  # type: ignore[misc]
        return answer["requests"]

    def _ask(self, record: JobRecord, answer: dict[str, object]) -> None:
        try:
            polled = job_status(record, self.connector, hosts=self.hosts)
            answer["requests"] = polled.ranks[0].requests if polled.ranks else None
        except BaseException as exc:  # noqa: BLE001 - raised in the watchdog's thread
            answer["bug"] = exc


def _awaiting_cause(status: JobStatus, since: list[float]) -> bool:
    """True for up to :data:`PEER_GRACE` seconds while every failed rank failed because it
    lost a peer (``PEER_LOST``) and no other rank has failed yet."""
    failed = [r for r in status.ranks if r.state == FAILED]
    secondary = bool(failed) and all(
        r.failure and any(said in r.failure for said in PEER_LOST) for r in failed)
    if not secondary:
        since.clear()
        return False
    if not since:
        since.append(time.monotonic())
    return time.monotonic() - since[0] < PEER_GRACE


def _long_unreachable(status: JobStatus, since: dict[str, float], timeout: float) -> str | None:
    now = time.monotonic()
    for host in list(since):
        if host not in status.unreachable:
            del since[host]
    for host, reason in status.unreachable.items():
        first = since.setdefault(host, now)
        if now - first > timeout:
            return f"{host} unreachable for {now - first:.0f}s ({reason})"
    return None
