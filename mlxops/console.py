"""Terminal output: live progress on stderr, per-host blocks and recaps on stdout (rich).

With ``--json`` nothing but the JSON document goes to stdout; progress stays on stderr and
only when stderr is a terminal.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from mlxops.transport.results import CHANGED, FAILED, OK, SKIPPED, UNREACHABLE, Results

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False)

STYLE = {OK: "green", CHANGED: "yellow", FAILED: "red", SKIPPED: "cyan", UNREACHABLE: "magenta"}


def status_text(status: str) -> Text:
    return Text(status.upper(), style=STYLE.get(status, ""))


@contextmanager
def host_progress(description: str, total: int, enabled: bool = True) -> Iterator[Any]:
    """A progress bar on stderr; yields ``advance()``. Silent when stderr is not a terminal."""
    if not enabled or not err.is_terminal:
        yield lambda: None
        return
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=err, transient=True) as progress:
        task = progress.add_task(description, total=total)
        yield lambda: progress.advance(task)


def print_json(document: Any) -> None:
    sys.stdout.write(json.dumps(document, indent=2, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


def recap(results: Results, counts: dict[str, dict[str, int]] | None = None) -> None:
    """Ansible's PLAY RECAP as a table: one row per host."""
    table = Table(title="recap", title_justify="left", show_edge=False, pad_edge=False)
    table.add_column("host")
    if counts:
        for status in (OK, CHANGED, FAILED, SKIPPED):
            table.add_column(status, justify="right", style=STYLE[status])
        table.add_column("unreachable", style=STYLE[UNREACHABLE])
        for host, result in results.items():
            c = counts.get(host, {})
            table.add_row(host, *(str(c.get(s, 0)) for s in (OK, CHANGED, FAILED, SKIPPED)),
                          "yes" if result.status == UNREACHABLE else "no")
    else:
        table.add_column("status")
        table.add_column("rc", justify="right")
        table.add_column("time", justify="right")
        for host, result in results.items():
            rc = "" if result.command is None else str(result.command.exit_code)
            table.add_row(host, status_text(result.status), rc, f"{result.duration:.2f}s")
    out.print(table)
