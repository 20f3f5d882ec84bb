"""Stop a job: SIGTERM every rank's process group, SIGKILL after the grace period, verify.

Idempotent: stopping a stopped (or finished) job checks again that nothing of it runs.
"""

from __future__ import annotations

from mlxops.jobs import nodecmd
from mlxops.jobs.record import FINISHED, STOPPED, JobRecord, inventory_hosts
from mlxops.transport import Connector, HostResult, Results, run_parallel
from mlxops.transport.results import FAILED, OK


def stop_job(record: JobRecord, connector: Connector, *, grace: float | None = None,
             forks: int | None = None, mark_stopped: bool = True,
             hosts: dict | None = None) -> Results:
    """Stop every rank on every host, in parallel; each host verifies its ports are free."""
    hosts = hosts or inventory_hosts(record)
    grace = record.stop_grace if grace is None else grace
    strays = reap_strays(record, connector, hosts=hosts, grace=grace)

    def work(host) -> HostResult:
        h = record.host(host.name)
        paths = h.paths(record.name)
        mine = record.ranks_on(host.name)
        ports = [str(r.port) for r in mine] if record.backend == "ring" else []
        answer = nodecmd.run_node(
            connector.connect(host), h.python, paths.code,
            ["stop", "--run-dir", paths.run_dir, "--grace", str(grace),
             "--ip", host.ip if ports else "", "--ports", *ports], timeout=grace + 60)
        if answer.get("alive"):
            return HostResult(host.name, FAILED, f"ranks {answer['alive']} survived SIGKILL",
                              data=answer)
        if answer.get("ports_busy"):
            return HostResult(host.name, FAILED, f"ports still in use: {answer['ports_busy']}",
                              data=answer)
        return HostResult(host.name, OK, data=answer)

    results = Results({**run_parallel([hosts[h.name] for h in record.hosts], work,
                                      forks=forks), **strays})
    if mark_stopped and record.state != FINISHED:
        record.state = STOPPED
        record.save()
    return results


def reap_strays(record: JobRecord, connector: Connector, *, hosts: dict | None = None,
                grace: float | None = None) -> Results:
    """Stop what still runs on hosts the job left behind; forget those that answered.

    A host that is still unreachable stays on the list (and costs one connect timeout);
    its result says so, so that nobody takes the job for stopped everywhere.
    """
    if not record.stray:
        return Results({})
    hosts = hosts or inventory_hosts(record)
    grace = record.stop_grace if grace is None else grace

    def work(host) -> HostResult:
        h = record.host(host.name)
        paths = h.paths(record.name)
        answer = nodecmd.run_node(connector.connect(host), h.python, paths.code,
                                  ["stop", "--run-dir", paths.run_dir, "--grace", str(grace)],
                                  timeout=grace + 60)
        if answer.get("alive"):
            return HostResult(host.name, FAILED, f"left behind earlier: ranks {answer['alive']} "
                              "survived SIGKILL", data=answer)
        return HostResult(host.name, OK, "left behind earlier: stopped what it still ran",
                          data=answer)

    results = run_parallel([hosts[h.name] for h in record.stray if h.name in hosts], work)
    for result in results.values():
        if not result.succeeded and not result.message.startswith("left behind"):
            result.message = f"left behind earlier, its ranks may still run: {result.message}"
    if results.succeeded:
        record.stray = [h for h in record.stray if h.name not in results.succeeded]
        record.save()
    return results
