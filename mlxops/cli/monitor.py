"""Watching runs: ``monitor`` (terminal), ``dashboard`` (local web page), ``report``
(one HTML file). All three read the job's metrics mirror (mlxops.monitor); ``monitor``
and the dashboard also feed it while they run, unless told to stay offline."""

from __future__ import annotations

import errno
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from mlxops import console
from mlxops.cli.options import connect_options, json_option
from mlxops.errors import EXIT_OK, MlxopsError, UserError
from mlxops.node.protocol import ENDED_STATES

if TYPE_CHECKING:
    from mlxops.transport import Connector, Results


def _feeder(name: str, connector: Connector, outcome: dict[str, Results]):
    """One look at the job's cluster for the mirror; none once the mirror holds the end of
    a job that ended (the cluster may be gone by now)."""
    from mlxops.jobs.record import load_record
    from mlxops.monitor import files
    from mlxops.monitor.mirror import feed

    def look() -> None:
        record = load_record(name)
        state = files.read_state(name)
        if record.state in ENDED_STATES and state.created == record.created \
                and state.updated is not None and state.updated >= record.updated:
            return
        results = feed(record, connector)
        if results is not None:
            outcome["last"] = results

    return look


@click.command("monitor")
@click.argument("name")
@click.option("--interval", type=click.FloatRange(0.5, 3600), default=2.0, show_default=True,
              help="Seconds between looks.")
@click.option("--once", is_flag=True, help="Look once, print the view and exit.")
@click.option("--offline", is_flag=True,
              help="Never connect: show the mirror as it is (after the cluster is gone, or "
                   "fed by a watch elsewhere).")
@connect_options
def monitor(name, interval, once, offline, connect):
    """Live terminal view of job NAME: per rank state, step, loss, tokens/s, memory,
    heartbeat; cluster totals, restarts and alerts. Ctrl-C leaves (the job runs on)."""
    from mlxops.jobs.record import load_record
    from mlxops.monitor import live  # rich's live view: only here
    from mlxops.transport import Connector

    load_record(name)  # an unknown name: exit 2 with the known ones, before connecting
    outcome: dict[str, Results] = {}
    try:
        if offline:
            live.run(name, None, interval=interval, once=once)
        else:
            with Connector(connect) as connector:
                live.run(name, _feeder(name, connector, outcome), interval=interval,
                         once=once)
    except KeyboardInterrupt:
        sys.exit(EXIT_OK)
    sys.exit(outcome["last"].exit_code if once and "last" in outcome else EXIT_OK)


@click.command("dashboard")
@click.option("--port", type=click.IntRange(1, 65535), default=8050, show_default=True)
@click.option("--host", "bind", default="127.0.0.1", show_default=True,
              help="Address to listen on. Anything but loopback exposes your jobs, without "
                   "authentication, to whoever reaches this machine: prefer ssh -L.")
@click.option("--interval", type=click.FloatRange(0.5, 3600), default=3.0, show_default=True,
              help="Seconds between looks at running jobs' clusters.")
@click.option("--offline", is_flag=True,
              help="Never connect: serve the mirrors as they are.")
@click.option("--metrics-only", is_flag=True,
              help="Serve /metrics (Prometheus) and nothing else: a headless controller.")
@connect_options
def dashboard(port, bind, interval, offline, metrics_only, connect):
    """Serve a local web page of every job: state, loss and tokens/s curves updating live,
    compute/all-reduce split, memory, restarts, per-node health, the last bench."""
    from mlxops.monitor import server as dashboard_server  # http.server: only here

    say = console.err.print  # rich's console made now: once listening, the lines come at once
    try:
        server = dashboard_server.make_server(bind, port, metrics_only=metrics_only)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise MlxopsError(f"port {port} on {bind} is in use: pick another with "
                              "--port") from None
        if isinstance(exc, socket.gaierror) or exc.errno in (errno.EADDRNOTAVAIL,
                                                             errno.EAFNOSUPPORT):
            raise UserError(f"--host: cannot listen on {bind!r}: {exc.strerror or exc}"
                            ) from None
        raise MlxopsError(f"cannot listen on {bind}:{port}: {exc}") from None
    try:  # from here a Ctrl-C ends the dashboard cleanly, even before it serves
        _serve_dashboard(server, say, bind, port, interval, offline, metrics_only, connect)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    sys.exit(EXIT_OK)


@click.command("report")
@click.argument("name")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The HTML file to write (default NAME-report.html; with --json, only "
                   "when given).")
@click.option("--refresh", is_flag=True,
              help="Look at the cluster once first (connects); else the mirror as it is.")
@json_option
@connect_options
def report_command(name, output, refresh, as_json, connect):
    """One self-contained HTML file of job NAME (opens offline): loss and tokens/s curves,
    tokens/s per rank, restarts, config, plan and bench figures."""
    from mlxops.jobs.record import load_record
    from mlxops.monitor import report
    from mlxops.monitor.data import MirrorReader
    from mlxops.monitor.mirror import feed
    from mlxops.transport import Connector

    load_record(name)
    code = EXIT_OK
    if refresh:
        with Connector(connect) as connector:
            results = feed(load_record(name), connector)
            code = results.exit_code if results is not None else EXIT_OK
    mirror = MirrorReader(name).read()
    if not mirror.samples:
        console.err.print(f"the mirror of {name!r} is empty (nothing looked at the cluster "
                          "while it ran): --refresh looks now", soft_wrap=True)
    if as_json:
        console.print_json(report.report_document(mirror))
    if output is not None or not as_json:
        target = report.write(report.report_document(mirror, points=report.POINTS),
                              output or Path(f"{name}-report.html"))
        console.err.print(f"wrote {target} ({len(mirror.metrics)} metrics lines, "
                          f"{len(mirror.samples)} looks at the cluster)", soft_wrap=True)
    sys.exit(code)


commands = [monitor, dashboard, report_command]


def _serve_dashboard(server, say, bind: str, port: int, interval: float, offline: bool,
                     metrics_only: bool, connect) -> None:
    """Say where the dashboard is, and serve until interrupted (the caller closes it)."""
    from mlxops.monitor import server as dashboard_server
    from mlxops.transport import Connector

    shown = f"[{bind}]" if ":" in bind else bind
    say(f"mlxops dashboard: http://{shown}:{port}/{'metrics' if metrics_only else ''}  "
        f"(Ctrl-C stops; Prometheus: http://{shown}:{port}/metrics)", soft_wrap=True)
    if dashboard_server.is_loopback(bind):
        say(f"  from another machine: ssh -L {port}:{shown}:{port} THIS_HOST", soft_wrap=True)
        say(f"  then open http://127.0.0.1:{port}/ there", soft_wrap=True)
    else:
        say(f"[yellow]  listening on {bind}: anyone who reaches port {port} here sees your "
            "jobs (no authentication)[/]", soft_wrap=True)
    with Connector(connect) as connector:
        feeds = None if offline else dashboard_server.JobFeeds(
            connector, interval, log=lambda m: console.err.print(f"feed: {m}",
                                                                 markup=False)).start()
        try:
            server.serve_forever(poll_interval=0.5)
        finally:
            if feeds:
                feeds.stop()
