"""Stop a job: SIGTERM every rank's process group, SIGKILL after the grace period, verify.

Idempotent: stopping a stopped (or finished) job checks again that nothing of it runs.

The user's stop is recorded first, then carried out on the ranks the record names at that
moment (both under the record lock, :mod:`mlxops.jobs.record`). A watchdog restarting the
job meanwhile either sees the stop before it starts a new attempt, or has recorded the new
attempt's ranks, which are then the ones stopped here; if its new ranks start after this
stop looked, its own record of them is refused and it stops them itself.
"""

from __future__ import annotations

from mlxops import shell
from mlxops.errors import MlxopsError
from mlxops.jobs.record import JobRecord, inventory_hosts, update
from mlxops.jobs.record import mark_stopped as mark_stopped_record
from mlxops.node import protocol
from mlxops.node.protocol import FAILED, RING
from mlxops.transport import Connector, HostResult, Results, nodecmd, run_parallel
from mlxops.transport.results import OK


def stop_job(record: JobRecord, connector: Connector, *, grace: float | None = None,
             forks: int | None = None, mark_stopped: bool = True,
             hosts: dict | None = None) -> Results:
    """Stop every rank on every host, in parallel; each host verifies its ports are free.

    Hosts the job left behind (``record.stray``) are stopped in the same pass.
    ``mark_stopped`` (a user's stop, not a watchdog's before a restart): the job is recorded
    as stopped first, and ``record`` becomes the record as it is then (the ranks stopped are
    that record's).
    """
    if mark_stopped:
        vars(record).update(vars(mark_stopped_record(record.name)))
    hosts = hosts or inventory_hosts(record)
    grace = record.stop_grace if grace is None else grace
    strays = _stray_hosts(record, hosts)
    stray_names = {host.name for host in strays}

    def work(host) -> HostResult:
        if host.name in stray_names:
            return _reap(record, connector, host, grace)
        host_ranks = record.ranks_on(host.name)
        ports = [r.port for r in host_ranks] if record.backend == RING else []
        answer = _stop_on(record, connector, host, grace, ports)
        if answer.alive:
            return HostResult(host.name, FAILED, f"ranks {answer.alive} survived SIGKILL",
                              data=answer.to_dict(), value=answer)
        if answer.ports_busy:
            return HostResult(host.name, FAILED, f"ports still in use: {answer.ports_busy}",
                              data=answer.to_dict(), value=answer)
        return HostResult(host.name, OK, data=answer.to_dict(), value=answer)

    results = run_parallel([*(hosts[h.name] for h in record.hosts), *strays], work,
                           forks=forks)
    _forget_reaped(record, results, strays)
    return results


def reap_strays(record: JobRecord, connector: Connector, *, hosts: dict | None = None,
                grace: float | None = None) -> Results:
    """Stop what still runs on hosts the job left behind; forget those that answered.

    A host that is still unreachable stays on the list (and costs one connect timeout);
    its result says so, so that nobody takes the job for stopped everywhere.
    """
    strays = _stray_hosts(record, hosts or inventory_hosts(record))
    grace = record.stop_grace if grace is None else grace
    results = run_parallel(strays, lambda host: _reap(record, connector, host, grace))
    _forget_reaped(record, results, strays)
    return results


def _stray_hosts(record: JobRecord, hosts: dict) -> list:
    return [hosts[h.name] for h in record.stray if h.name in hosts]


def _reap(record: JobRecord, connector: Connector, host, grace: float) -> HostResult:
    answer = _stop_on(record, connector, host, grace)
    if answer.alive:
        return HostResult(host.name, FAILED, f"ranks {answer.alive} survived SIGKILL",
                          data=answer.to_dict(), value=answer)
    return HostResult(host.name, OK, "left behind earlier: stopped what it still ran",
                      data=answer.to_dict(), value=answer)


def _forget_reaped(record: JobRecord, results: Results, strays: list) -> None:
    """Drop the strays that were stopped from the record; say of the others that their
    ranks may still run (an unreachable one's message is the transport's)."""
    names = {host.name for host in strays}
    for name in names:
        if not results[name].succeeded:
            results[name].message = ("left behind earlier, its ranks may still run: "
                                      + results[name].message)
    reaped = names & set(results.succeeded)
    if reaped:
        def forget(current: JobRecord) -> None:
            current.stray = [h for h in current.stray if h.name not in reaped]

        record.stray = update(record.name, forget).stray


def _stop_on(record: JobRecord, connector: Connector, host, grace: float,
             ports: list[int] | None = None) -> protocol.StopAnswer:
    """The node's own stop of the job's ranks there; with ``ports``, it also checks that
    those ports on the host's address are free again."""
    h = record.host(host.name)
    paths = h.paths(record.name)
    return nodecmd.run_node(connector.connect(host), h.python, paths.code,
                            protocol.stop_args(paths.run_dir, grace, ip=host.ip,
                                               ports=ports or ()),
                            timeout=grace + 60)


def remove_run_dirs(record: JobRecord, connector: Connector,
                    forks: int | None = None) -> Results:
    """``rm -rf`` the job's run directory on every host of its record (once nothing of it
    runs: the caller stopped it); a host that cannot is failed with the reason."""
    hosts = inventory_hosts(record)

    def work(host) -> None:
        run_dir = record.host(host.name).paths(record.name).run_dir
        done = connector.connect(host).run(shell.join(["rm", "-rf", run_dir]), timeout=60)
        if not done.ok:
            raise MlxopsError(f"rm -rf {run_dir}: {done.error_line()}")

    return run_parallel([hosts[h.name] for h in record.hosts], work, forks=forks)
