"""Job commands: launch, status, logs, watch, stop, resume (thin layers over mlxops.jobs).

What a command uses is imported in it (the start-up of ``status`` is not ``launch``'s)."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

import click

from mlxops import console, events
from mlxops.cli.options import connect_options, forks_option, json_option
from mlxops.errors import EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE
from mlxops.node.protocol import FAILED, FINISHED, RUNNING, STALLED, STOPPED

if TYPE_CHECKING:
    from mlxops.jobs.serveprobe import ServeFigures
    from mlxops.jobs.status import JobStatus


def _exit_for(status: JobStatus) -> int:
    if status.state == FAILED:
        return EXIT_FAILED
    if status.unreachable:
        return EXIT_UNREACHABLE
    return EXIT_OK


def _warn(message: str) -> None:
    from rich.markup import escape

    console.err.print(f"[yellow]warning:[/] {escape(message)}", soft_wrap=True)


def _after_start(record, connector, detach: bool, as_json: bool) -> None:
    from mlxops.cli.watch import hints, print_status, watch_job
    from mlxops.jobs.record import load_record
    from mlxops.jobs.status import job_status

    if detach:
        status = job_status(record, connector)
        if as_json:
            console.print_json(status.to_dict())
        else:
            console.out.print(f"job {record.name!r} started: {record.world_size} ranks on "
                              f"{len(record.hosts)} host(s), attempt {record.attempt}"
                              + (f" ({record.message})" if record.message else ""))
            console.out.print(f"Next: mlxops watch {record.name} | mlxops status {record.name} "
                              f"| mlxops logs {record.name} -f | mlxops stop {record.name}")
        sys.exit(_exit_for(status))
    status = watch_job(record, connector)
    if as_json:
        console.print_json(status.to_dict())
    else:
        print_status(status)
        hints(load_record(record.name), status)
    sys.exit(_exit_for(status))


@click.command("launch")
@click.argument("job", type=click.Path(dir_okay=False))
@click.option("--detach", "-d", is_flag=True, help="Start and return; the job runs on its own.")
@click.option("--fresh", is_flag=True,
              help="Start over: remove an earlier run of this name (checkpoints, metrics, logs) "
                   "from every node first. Refused while any rank of it runs.")
@json_option
@forks_option
@connect_options
def launch(job, detach, fresh, as_json, forks, connect):
    """Start JOB on its hosts and follow it (Ctrl-C detaches, never kills).

    Pre-flight checks every host first (reachable, same mlx, code synced, ring ports free,
    no leftover rank): nothing starts anywhere unless all pass.
    """
    from mlxops.jobs.spec import load_job
    from mlxops.transport import Connector

    spec = load_job(job)  # a bad job file is refused before the launch machinery loads
    from mlxops.jobs.supervising import launch_job

    def started(record) -> None:
        events.start_run(events.make(
            record.name, events.STARTED, f"{record.world_size} ranks on "
            f"{len(record.hosts)} host(s)", attempt=record.attempt,
            hosts=[h.name for h in record.hosts], world_size=record.world_size))

    with Connector(connect) as connector:
        record = launch_job(spec, connector, forks=forks, fresh=fresh, on_warning=_warn,
                            on_started=started)
        _after_start(record, connector, detach, as_json)


@click.command("resume")
@click.argument("name")
@click.option("--exclude", "-x", metavar="HOST,..", default="",
              help="Continue without these hosts (the global batch stays the same).")
@click.option("--detach", "-d", is_flag=True)
@json_option
@forks_option
@connect_options
def resume(name, exclude, detach, as_json, forks, connect):
    """Relaunch job NAME from the newest checkpoint that every node has.

    Reads the job file again (e.g. after raising train.steps); the watchdog's own restarts
    run the job as it was launched.
    """
    from mlxops.jobs.record import load_record
    from mlxops.jobs.spec import load_job
    from mlxops.jobs.supervising import launch_job, retire
    from mlxops.transport import Connector

    record = load_record(name)
    spec = load_job(record.job_file)
    # A host that needs a reboot (its ranks survived SIGKILL) is never resumed onto.
    excluded = sorted(set(record.excluded) | set(record.needs_reboot)
                      | {h.strip() for h in exclude.split(",") if h.strip()})

    def started(record) -> None:
        events.record(record.name, events.RESUMED,
                      (record.message or "resumed") + (f", without {', '.join(excluded)}"
                                                       if excluded else ""),
                      attempt=record.attempt, excluded=excluded,
                      world_size=record.world_size)

    with Connector(connect) as connector:
        record = retire(record, connector)  # its supervisor restarts nothing meanwhile
        record = launch_job(spec, connector, resume=True, exclude=excluded, forks=forks,
                            previous=record, on_warning=_warn, on_started=started)
        _after_start(record, connector, detach, as_json)


@click.command("watch")
@click.argument("name")
@connect_options
def watch(name, connect):
    """Follow job NAME and supervise it: restart on a dead or stalled rank."""
    from mlxops.cli.watch import hints, print_status, watch_job
    from mlxops.jobs.record import load_record
    from mlxops.jobs.supervisor import ENV_HOST
    from mlxops.transport import Connector

    record = load_record(name)
    with Connector(connect) as connector:
        status = watch_job(record, connector)
        print_status(status)
        hints(load_record(name), status)
        if os.environ.get(ENV_HOST):
            # A supervisor on a node whose job ended did its work: a failure is the job's
            # (in its record), and launchd starts again an agent that exits unsuccessfully.
            sys.exit(EXIT_OK)
        sys.exit(_exit_for(status))


@click.command("status")
@click.argument("name", required=False)
@json_option
@connect_options
def status(name, as_json, connect):
    """Where job NAME is: per rank host, pid, state, step, loss, tokens/s, heartbeat."""
    from mlxops.jobs.jobdirs import list_jobs

    if name is None and not list_jobs():
        # Answered from the job directory alone: nothing more to import (typed often).
        if as_json:
            console.print_json({"jobs": []})
        else:
            click.echo("no jobs yet. Start one: mlxops launch JOB.yml")
        sys.exit(EXIT_OK)
    from mlxops.cli.watch import print_status
    from mlxops.jobs.record import load_record
    from mlxops.jobs.status import job_status
    from mlxops.transport import Connector

    with Connector(connect) as connector:
        if name is None:
            statuses = [job_status(load_record(n), connector) for n in list_jobs()]
            if as_json:
                console.print_json({"jobs": [s.to_dict() for s in statuses]})
            for s in statuses if not as_json else []:
                step = "-" if s.step is None else s.step
                console.out.print(f"{s.name}: {s.state} step {step}/{s.steps or '?'} "
                                  f"({len(s.ranks)} ranks, attempt {s.attempt})")
            sys.exit(EXIT_OK)
        record = load_record(name)
        lease = None
        if record.supervisor is not None:
            from mlxops.jobs import supervising

            record = supervising.fetch(record, connector)  # the supervisor's files are truth
            lease = supervising.lease(record, connector)
        st = job_status(record, connector)
        if record.workload is not None and record.workload.probed and st.state == RUNNING \
                and st.ranks:
            st.serve = _live_figures(record, connector, st)
        if as_json:
            console.print_json({**st.to_dict(), "supervisor": _lease_dict(lease)})
        else:
            print_status(st)
            console.out.print("  " + (lease.line() if lease else "supervised by the controller"
                                      " (mlxops watch / launch)"), markup=False)
            if lease is not None and not lease.held and lease.reachable \
                    and st.state in (RUNNING, STALLED):
                console.out.print(f"  nothing restarts a dead rank now: mlxops watch {name} "
                                  "starts it again", markup=False)
        sys.exit(EXIT_UNREACHABLE if st.unreachable else EXIT_OK)


def _lease_dict(lease) -> dict | None:
    """``status --json``'s ``supervisor``: null when the controller supervises."""
    if lease is None:
        return None
    return {"host": lease.host, "running": lease.held, "pid": lease.pid,
            "reachable": lease.reachable, "reason": lease.reason}


def _live_figures(record, connector, st: JobStatus) -> ServeFigures | None:
    """A probed job's figures from one look now (a server's latency: one probe; its
    requests: its node's count), on rank 0's host."""
    from mlxops.jobs.record import inventory_hosts
    from mlxops.transport import HostUnreachable

    try:
        conn = connector.connect(inventory_hosts(record)[record.ranks[0].host])
        return record.workload.look_now(conn, st.ranks[0].requests)
    except HostUnreachable:
        return None


@click.command("logs")
@click.argument("name")
@click.option("--rank", "-r", type=int, default=None, help="Only this rank.")
@click.option("--follow", "-f", "follow_", is_flag=True, help="Keep printing new lines.")
@connect_options
def logs(name, rank, follow_, connect):
    """The ranks' output, merged, each line prefixed with host and rank."""
    from mlxops.cli.watch import echo_line, print_failures
    from mlxops.jobs import logs as joblogs
    from mlxops.jobs.record import load_record
    from mlxops.jobs.status import job_status
    from mlxops.transport import Connector

    record = load_record(name)
    if record.supervisor is not None:  # the attempt running now is in the supervisor's
        from mlxops.jobs.supervising import fetch
        from mlxops.transport import Connector

        with Connector(connect) as connector:
            record = fetch(record, connector)
    if rank is not None and rank not in {r.rank for r in record.ranks}:
        raise click.BadParameter(f"job {name!r} has ranks 0..{record.world_size - 1}",
                                 param_hint="--rank")
    with Connector(connect) as connector:
        if follow_:
            try:
                ended = joblogs.follow(name, connector, echo_line, rank=rank)
            except KeyboardInterrupt:
                return
        else:
            for line in joblogs.prefixed(joblogs.fetch(record, connector, {}, rank=rank)):
                echo_line(line)
            ended = job_status(record, connector)
        # The logs repeat a failure once per rank (a traceback each): say each cause once,
        # on stderr, so that stdout stays the logs.
        if ended.failures:
            console.err.print("why ranks failed:")
            print_failures(ended, console.err)


@click.command("stop")
@click.argument("name")
@click.option("--grace", type=click.FloatRange(0, 600), default=None,
              help="Seconds between SIGTERM and SIGKILL (default: the job's stop_grace, 5).")
@json_option
@connect_options
def stop(name, grace, as_json, connect):
    """Stop every rank of job NAME and verify nothing of it runs (safe to repeat)."""
    from mlxops.jobs.record import load_record
    from mlxops.jobs.stop import stop_job
    from mlxops.jobs.supervising import retire
    from mlxops.transport import Connector

    record = load_record(name)
    with Connector(connect) as connector:
        record = retire(record, connector)  # the supervisor first: it restarts nothing now
        results = stop_job(record, connector, grace=grace)
    stopped = load_record(name)
    if results.exit_code == EXIT_OK and stopped.state == STOPPED:
        events.record(name, events.STOPPED, "stopped (mlxops stop)", attempt=stopped.attempt)
    if as_json:
        console.print_json({"name": name, "state": load_record(name).state, "hosts": {
            h: {"status": r.status, "message": r.message, **r.data} for h, r in results.items()}})
    else:
        for host, result in results.items():
            data = result.data or {}
            detail = result.message or (
                f"{len(data.get('signalled', []))} rank(s) stopped"
                + (f", {len(data['killed'])} needed SIGKILL" if data.get("killed") else ""))
            console.out.print(f"{host}: ", console.status_text(result.status), f" {detail}",
                              sep="")
        if results.exit_code == EXIT_OK:
            state = load_record(name).state
            verb = "was already finished" if state == FINISHED else "is stopped"
            console.out.print(f"job {name!r} {verb}; nothing of it runs. Next: mlxops resume "
                              f"{name}" if state == STOPPED else f"job {name!r} {verb}")
    sys.exit(results.exit_code)


commands = [launch, resume, watch, status, logs, stop]
