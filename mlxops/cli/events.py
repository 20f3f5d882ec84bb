"""``mlxops events NAME``: the job's timeline (launch, stalls, restarts and why, stops,
resumes, alerts, notifications), read from the controller alone (no connection)."""

from __future__ import annotations

import datetime
import sys

import click

from mlxops import console, events
from mlxops.cli.options import json_option
from mlxops.errors import EXIT_OK

STYLE = {events.FAILED: "red", events.STALLED: "yellow", events.RESTARTED: "yellow",
         events.ALERT: "yellow", events.PLATEAU: "yellow", events.NOTIFY_FAILED: "red",
         events.FINISHED: "green", events.NOTIFIED: "dim"}


def _when(t: float) -> str:
    return datetime.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")


@click.command("events")
@click.argument("name")
@click.option("--kind", "-k", "kinds", multiple=True, type=click.Choice(events.KINDS),
              help="Only events of this kind (repeat for several).")
@json_option
def command(name, kinds, as_json):
    """The timeline of job NAME: launch, each restart and its reason, stops, resumes,
    alerts and the notifications sent, oldest first."""
    from rich.markup import escape

    from mlxops.jobs.record import load_record

    record = load_record(name)  # an unknown name: the one-line error with the known jobs
    if record.supervisor is not None:  # the timeline is written on the supervisor's host
        from mlxops.jobs.supervising import fetch
        from mlxops.transport import Connector

        with Connector() as connector:
            fetch(record, connector)
    found = [e for e in events.read(name, events.skip_note(name)) if not kinds or e.kind in kinds]
    if as_json:
        console.print_json({"name": name, "events": [e.to_dict() for e in found]})
        sys.exit(EXIT_OK)
    if not found:
        console.out.print(f"job {name!r} has no events yet")
    for e in found:
        style = STYLE.get(e.kind, "bold")
        attempt = f" #{e.attempt}" if e.attempt is not None else ""
        console.out.print(f"{_when(e.time)}{attempt} [{style}]{e.kind:<13}[/] "
                          f"{escape(e.message)}", soft_wrap=True)
    sys.exit(EXIT_OK)
