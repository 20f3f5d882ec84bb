"""The watchdog: follow a job, and stop + resume it when a rank dies, vanishes or stalls.

MLX collectives have no timeout: when one rank dies or hangs, every other rank waits in
its all-reduce forever. Only something outside the ranks can notice, and only killing the
process groups frees their ports (and, on a Mac, their GPU memory). That is this loop.

A restart never undoes a user's ``mlxops stop`` (see :mod:`mlxops.jobs.record`): under
the record lock the watchdog checks that the job was not stopped before it starts a new
attempt, and the new attempt's record is refused if a stop came while its ranks were
starting, in which case the watchdog stops what it just started. A restart runs the job
as launched (kept in the record), not the job file as it reads now.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from mlxops.errors import MlxopsError
from mlxops.jobs.launch import launch
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
from mlxops.jobs.status import JobStatus, job_status
from mlxops.jobs.stop import reap_strays, stop_job
from mlxops.node.protocol import FAILED, FINISHED, RUNNING, STOPPED
from mlxops.transport import Connector, GroupError, HostUnreachable

OnStatus = Callable[[JobStatus], None]
STRAY_RETRY = 30.0  # seconds between attempts to reach a host the job left behind
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
    stop_job(record, connector, mark_stopped=False)
    entry = Restart(time=time.time(), reason=reason, attempt=record.attempt)

    def begin(current: JobRecord) -> None:
        if current.state == STOPPED:
            raise JobStopped(current)
        current.restarts.append(entry)

    previous = update(record.name, begin)
    try:
        return _relaunch(spec, previous, connector, on_event)
    except JobStopped as exc:
        on_event("stopped (mlxops stop) while the ranks were starting: stopping them again")
        stop_job(exc.record, connector, mark_stopped=False)
        raise


def _relaunch(spec: JobSpec, previous: JobRecord, connector: Connector,
              on_event: OnEvent) -> JobRecord:
    try:
        return launch(spec, connector, resume=True, exclude=previous.excluded,
                      previous=previous, on_warning=on_event)
    except GroupError as exc:
        gone = exc.results.unreachable
        if not (previous.restart.exclude_unreachable and gone):
            raise
    # A Mac that is down (powered off, asleep, off the network) need not end the run:
    # go on without it, same global batch, from the newest checkpoint the rest share.
    on_event(f"continuing without {', '.join(gone)} (unreachable)")
    new = launch(spec, connector, resume=True, exclude=[*previous.excluded, *gone],
                 previous=previous, on_warning=on_event)
    left = [previous.host(h) for h in gone]

    def add_strays(current: JobRecord) -> None:
        current.stray += [h for h in left if h.name not in {s.name for s in current.stray}]

    new.stray = update(new.name, add_strays).stray
    return new


def _end(name: str, state: str, message: str) -> None:
    """Record how the job ended, unless the user stopped it meanwhile (that stays)."""
    def end(current: JobRecord) -> None:
        if current.state != STOPPED:
            current.state, current.message = state, message

    update(name, end)


def _finished(current: JobRecord) -> None:
    current.state = FINISHED  # every rank finished: true even if a stop came meanwhile


def supervise(record: JobRecord, connector: Connector, *, on_status: OnStatus = lambda _: None,
              on_event: OnEvent = lambda _: None, poll: float | None = None) -> JobStatus:
    """Watch until the job finishes, fails for good, or is stopped; restart on problems.

    ``on_status`` gets every status polled: the terminal's progress bar, and the metrics
    mirror's :class:`~mlxops.monitor.mirror.Feeder` (the monitor sits above the jobs, so
    whoever starts the watchdog passes its feeder in).
    """
    hosts = inventory_hosts(record)
    unreachable_since: dict[str, float] = {}
    next_reap = 0.0
    serve = record.serve
    probes = ProbeWatch(serve, record.ranks[0].host) if serve else None
    while True:
        if record.stray and time.monotonic() >= next_reap:
            # A host left behind may be back: its old ranks still hold memory and ports.
            for name in reap_strays(record, connector).succeeded:
                on_event(f"{name} is back: stopped the ranks it still ran")
            next_reap = time.monotonic() + STRAY_RETRY
        status = job_status(record, connector, hosts=hosts)
        probed = None
        if probes is not None and status.state == RUNNING and not status.problem:
            own = probes.answered  # the node counted the requests before this look's
            probed = _probe(probes, connector, hosts)
            status.serve = probes.figures(status.ranks[0].requests if status.ranks else None,
                                          own)
        on_status(status)  # e.g. the monitor's feeder (monitor.mirror.Feeder.on_status)
        if status.state == FINISHED:
            record.state = update(record.name, _finished).state
            return status
        if status.state == STOPPED or load_record(record.name).state == STOPPED:
            return status  # stopped on purpose (here or by `mlxops stop` elsewhere)
        if probed and probes is not None and not probes.last.hung:
            # A server that stopped answering has usually died: its rank's exit code, a
            # moment behind, names the cause better than the refused probe does.
            status = job_status(record, connector, hosts=hosts)
        problem = status.problem or _long_unreachable(status, unreachable_since,
                                                      record.restart.stall_timeout) or probed
        if problem:
            if len(record.restarts) >= record.restart.max_restarts:
                stop_job(record, connector, mark_stopped=False)
                message = f"gave up after {len(record.restarts)} restarts: {problem}"
                _end(record.name, FAILED, message)
                on_event(message)
                return job_status(load_record(record.name), connector, hosts=hosts)
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
            if serve is not None:
                probes = ProbeWatch(serve, record.ranks[0].host)
            on_event(f"restarted: attempt {record.attempt}"
                     + (f", {record.message}" if record.message else ""))
        time.sleep(poll if poll is not None else record.restart.interval)


def _probe(probes: ProbeWatch, connector: Connector, hosts: dict) -> str | None:
    """A serve job's probe (:mod:`mlxops.jobs.serveprobe`); a host that cannot be reached
    is the unreachable rule's to judge, not the probe's."""
    try:
        return probes.look(connector.connect(hosts[probes.host]))
    except HostUnreachable:
        return None


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
