"""The watchdog: follow a job, and stop + resume it when a rank dies, vanishes or stalls.

MLX collectives have no timeout: when one rank dies or hangs, every other rank waits in
its all-reduce forever. Only something outside the ranks can notice, and only killing the
process groups frees their ports (and, on a Mac, their GPU memory). That is this loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from mlxops.errors import MlxopsError
from mlxops.jobs.launch import launch
from mlxops.jobs.record import JobRecord, inventory_hosts, load_record
from mlxops.jobs.spec import load_job
from mlxops.jobs.status import JobStatus, gather
from mlxops.jobs.stop import reap_strays, stop_job
from mlxops.node.protocol import FAILED, FINISHED, STOPPED
from mlxops.transport import Connector, GroupError

OnStatus = Callable[[JobStatus], None]
STRAY_RETRY = 30.0  # seconds between attempts to reach a host the job left behind
OnEvent = Callable[[str], None]


def restart(record: JobRecord, connector: Connector, reason: str,
            on_event: OnEvent = lambda _: None) -> JobRecord:
    """Stop every rank, record why, and resume from the newest common checkpoint."""
    on_event(f"restarting ({reason})")
    stop_job(record, connector, mark_stopped=False)
    record.restarts.append({"time": time.time(), "reason": reason, "attempt": record.attempt})
    record.save()
    spec = load_job(record.job_file)
    try:
        return launch(spec, connector, resume=True, exclude=record.excluded, previous=record)
    except GroupError as exc:
        gone = exc.results.unreachable
        if not (record.exclude_unreachable and gone):
            raise
        # A Mac that is down (powered off, asleep, off the network) need not end the run:
        # go on without it, same global batch, from the newest checkpoint the rest share.
        on_event(f"continuing without {', '.join(gone)} (unreachable)")
        new = launch(spec, connector, resume=True, exclude=[*record.excluded, *gone],
                     previous=record)
        new.stray += [record.host(h) for h in gone]
        new.save()
        return new


def supervise(record: JobRecord, connector: Connector, *, on_status: OnStatus = lambda _: None,
              on_event: OnEvent = lambda _: None, poll: float | None = None) -> JobStatus:
    """Watch until the job finishes, fails for good, or is stopped; restart on problems."""
    hosts = inventory_hosts(record)
    unreachable_since: dict[str, float] = {}
    next_reap = 0.0
    while True:
        if record.stray and time.monotonic() >= next_reap:
            # A host left behind may be back: its old ranks still hold memory and ports.
            for name in reap_strays(record, connector).succeeded:
                on_event(f"{name} is back: stopped the ranks it still ran")
            next_reap = time.monotonic() + STRAY_RETRY
        status = gather(record, connector, hosts=hosts)
        on_status(status)
        if status.state == FINISHED:
            record.state = FINISHED
            record.save()
            return status
        if status.state == STOPPED or load_record(record.name).state == STOPPED:
            return status  # stopped on purpose (here or by `mlxops stop` elsewhere)
        problem = status.problem or _long_unreachable(status, unreachable_since,
                                                      record.stall_timeout)
        if problem:
            if len(record.restarts) >= record.max_restarts:
                stop_job(record, connector, mark_stopped=False)
                record.state = FAILED
                record.message = f"gave up after {len(record.restarts)} restarts: {problem}"
                record.save()
                on_event(record.message)
                return gather(record, connector, hosts=hosts)
            try:
                record = restart(record, connector, problem, on_event)
            except MlxopsError as exc:
                record.state = FAILED
                record.message = f"restart failed: {exc}"
                record.save()
                on_event(record.message)
                raise
            unreachable_since.clear()
            on_event(f"restarted: attempt {record.attempt}"
                     + (f", {record.message}" if record.message else ""))
        time.sleep(poll if poll is not None else _poll_interval(record))


def _poll_interval(record: JobRecord) -> float:
    if record.poll_interval:
        return record.poll_interval
    # Look often enough to notice a stall well within its timeout, at most twice a second.
    return max(0.5, min(2.0, record.stall_timeout / 10))


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
