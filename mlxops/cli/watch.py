"""Watching a job in the terminal (``mlxops watch``, and ``launch`` without ``--detach``):
a progress bar of steps with loss and tokens/s.

Watching supervises too (the watchdog restarts the job on a dead or stalled rank) unless
another mlxops process already does (then it only shows). Ctrl-C detaches: the job keeps
running on the nodes.
"""

from __future__ import annotations

import datetime
import time
from typing import TYPE_CHECKING

import click

from mlxops import console
from mlxops.jobs.fastsynch import RISK
from mlxops.jobs.notifying import start_notifier
from mlxops.jobs.record import JobRecord, supervisor_lock
from mlxops.jobs.serveprobe import ServeFigures
from mlxops.jobs.status import JobStatus, job_status, where
from mlxops.jobs.supervisor import supervised_elsewhere
from mlxops.jobs.watch import supervise
from mlxops.monitor.mirror import Feeder
from mlxops.node.protocol import (
    FINISHED,
    RUNNING,
    STALLED,
)
from mlxops.transport import Connector

FOLLOW_EVERY = 5.0  # seconds between looks at a job a node supervises

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table


def _describe(status: JobStatus) -> str:
    lead = next((r for r in status.ranks if r.rank == 0), None)
    parts = [f"[bold]{status.name}[/]", console.state_markup(status.state)]
    if lead and lead.loss is not None:
        parts.append(f"loss {lead.loss:.4f}")
    if lead and lead.tokens_per_sec:
        parts.append(f"{lead.tokens_per_sec:,.0f} tok/s")
    if status.restarts:
        parts.append(f"restarts {len(status.restarts)}")
    return " | ".join(parts)


def watch_job(record: JobRecord, connector: Connector) -> JobStatus:
    """Show (and supervise) the job until it ends; returns the final status."""
    try:
        if supervised_elsewhere(record):
            console.err.print(f"{record.supervisor.host} supervises this job: following only")
            return _follow_remote(record, connector)
        with supervisor_lock(record.name) as supervising:
            if not supervising:
                console.err.print("another mlxops process supervises this job: following only")
            return _watch(record, connector, supervising)
    except KeyboardInterrupt:
        console.err.print(
            f"\ndetached: job {record.name!r} keeps running on the nodes.\n"
            f"  mlxops watch {record.name}    follow and supervise again\n"
            f"  mlxops status {record.name}   where it is\n"
            f"  mlxops stop {record.name}     stop it")
        raise SystemExit(0) from None


def _watch(record: JobRecord, connector: Connector, supervising: bool) -> JobStatus:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console.err,
                  disable=not console.err.is_terminal) as progress:
        task = progress.add_task(record.name, total=record.steps or None)
        last_logged = [-1]

        def on_status(status: JobStatus) -> None:
            step = status.step or 0
            progress.update(task, completed=step, description=_describe(status))
            if not console.err.is_terminal and step >= last_logged[0] + 10:
                # No live bar (CI, a pipe): a line now and then instead.
                last_logged[0] = step
                console.err.print(_describe(status) + f" | step {step}/{status.steps or '?'}")

        def on_event(message: str) -> None:
            progress.console.print(f"[yellow]watchdog:[/] {message}")

        if supervising:
            feeder = Feeder(record.name, connector)  # for monitor, dashboard and report

            def show_and_feed(status: JobStatus) -> None:
                on_status(status)
                feeder.on_status(status)

            notifier = start_notifier(record, on_event)  # beside the watchdog, never in it
            try:
                return supervise(record, connector, on_status=show_and_feed,
                                 on_event=on_event)
            finally:
                if notifier:
                    notifier.close()  # the last events (finished, failed) go out first
                feeder.wait()  # the last lines before a failure, kept
        while True:
            status = job_status(record, connector)
            on_status(status)
            if status.state not in (RUNNING, STALLED):
                return status
            time.sleep(1.0)


def _follow_remote(record: JobRecord, connector: Connector) -> JobStatus:
    """Follow a job a node supervises: its files fetched, its ranks asked, every
    :data:`FOLLOW_EVERY` seconds; a supervisor found not running while the job runs is
    started again (the one thing the controller does for it)."""
    from mlxops.jobs import supervising

    shown = len(record.restarts)
    while True:
        record = supervising.fetch(record, connector)
        status = job_status(record, connector)
        for restart in record.restarts[shown:]:
            console.err.print(f"[yellow]{record.supervisor.host}:[/] restarted "
                              f"(attempt {restart.attempt}): {restart.reason}")
        shown = len(record.restarts)
        console.err.print(_describe(status) + f" | step {status.step or 0}/"
                          f"{status.steps or '?'}")
        if status.state not in (RUNNING, STALLED):
            return status
        lease = supervising.lease(record, connector)
        if lease.reachable and not lease.held:
            console.err.print(f"[yellow]{lease.line()}: starting it again[/]")
            record = supervising.start(record, connector, record.supervisor)
        time.sleep(FOLLOW_EVERY)


def status_table(status: JobStatus) -> Table:
    """One row per rank, in 80 columns for host names up to ~15 characters."""
    table = console.table(
        console.column("rank", right=True), console.column("host", wrap=True),
        console.column("pid", right=True), console.column("state"),
        console.column("step", right=True), console.column("loss", right=True),
        console.column("tok/s", right=True), console.column("heartbeat", right=True))
    for r in status.ranks:
        table.add_row(
            str(r.rank), r.host, str(r.pid or ""),
            console.state_markup(r.state)
            + (f" ({r.exit})" if r.exit not in (None, 0) else ""),
            "" if r.step is None else str(r.step),
            "" if r.loss is None else f"{r.loss:.4f}",
            "" if not r.tokens_per_sec else f"{r.tokens_per_sec:,.0f}",
            "" if r.heartbeat_age is None else f"{r.heartbeat_age:.1f}s ago")
    return table


def print_status(status: JobStatus) -> None:
    head = (f"[bold]{status.name}[/]: {console.state_markup(status.state)}"
            f" | step {status.step if status.step is not None else '-'}"
            f"/{status.steps or '?'} | attempt {status.attempt}")
    console.out.print(head)
    if status.message:
        console.out.print(f"  {status.message}", markup=False)
    if status.fast_synch:
        console.out.print(f"  [yellow]{RISK}[/]")
    console.print_table(status_table(status))
    if status.validation:
        console.out.print(f"  {status.validation}", markup=False)
    if status.serve is not None:
        console.out.print("  " + serve_line(status.serve), markup=False)
    print_failures(status)
    for restart in status.restarts:
        when = datetime.datetime.fromtimestamp(restart.time).strftime("%H:%M:%S")
        console.out.print(f"  restart at {when} (attempt {restart.attempt}): "
                          f"{restart.reason}", markup=False)
    for host, reason in status.unreachable.items():
        console.out.print(f"  [magenta]{host} unreachable[/]: {reason}")
    for host in status.needs_reboot:
        console.out.print(f"  [red]{host} needs reboot[/]: a rank there survived SIGKILL (a "
                          "wedged GPU?); the job runs without it and is never placed there "
                          "again")
    for host in (h for h in status.stray if h not in status.needs_reboot):
        console.out.print(f"  [yellow]{host} was left behind while unreachable[/]: its old ranks "
                          f"may still run; `mlxops stop {status.name}` stops them once it answers")


def serve_line(figures: ServeFigures) -> str:
    """``serving: 12 requests | 210 tokens/s (canary) | latency 18 ms``."""
    parts = [f"{figures.requests} requests" if figures.requests is not None else None,
             f"{figures.tokens_per_sec:,.0f} tokens/s (canary)"
             if figures.tokens_per_sec is not None else None,
             f"latency {figures.latency * 1e3:.0f} ms" if figures.latency is not None
             else "no answer to the probe"]
    return "serving: " + " | ".join(p for p in parts if p)


def print_failures(status: JobStatus, to: Console | None = None) -> None:
    """Each distinct reason the failed ranks failed, once, with the ranks that share it:
    ``node1 r0-1, node2 r2 failed: RuntimeError: ...``."""
    for failure in status.failures:
        (to or console.out).print(f"  {where(failure.ranks)} failed: {failure.why}",
                                  markup=False, soft_wrap=True)  # one line, to paste


def hints(record: JobRecord, status: JobStatus) -> None:
    name = record.name
    if status.state == FINISHED:
        console.out.print(f"\njob {name!r} finished. Next: mlxops logs {name} | "
                          f"mlxops status {name} --json | mlxops resume {name} (after raising "
                          "train.steps)")
    else:
        console.out.print(f"\nNext: mlxops logs {name} --rank 0 | mlxops status {name} | "
                          f"mlxops resume {name}")


def echo_line(line: str) -> None:
    click.echo(line)
