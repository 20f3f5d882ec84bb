"""Terminal output: live progress on stderr, per-host blocks and recaps on stdout (rich).

With ``--json`` nothing but the JSON document goes to stdout; progress stays on stderr and
only when stderr is a terminal.

Tables share one style (:func:`table`, :func:`column`) made to stay readable in 80
columns: no borders, short one-line headers with the unit in them, numbers never wrapped,
text folded rather than cut (never an ellipsis). Printed to a pipe or a file they are
never squeezed into a guessed width: :func:`print_table` gives them the width they need.

rich is imported on first use (``out``, ``err``, a table), not with this module: every
command imports it, and ``--help``, a bad input or ``status`` with no jobs print nothing
of rich's (tests/unit/cli/test_startup.py).
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from mlxops.node import protocol
from mlxops.transport.results import CHANGED, FAILED, OK, SKIPPED, UNREACHABLE, Results

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Column, Table
    from rich.text import Text

#: How a rank's or a job's state is coloured wherever it is shown (status, follow, monitor).
STATE_STYLE = {protocol.RUNNING: "green", protocol.FINISHED: "bold green",
               protocol.FAILED: "bold red", protocol.STALLED: "yellow",
               protocol.STOPPED: "cyan", protocol.UNREACHABLE: "magenta"}


def state_markup(state: str | None) -> str:
    """``[green]running[/]``: a state in its colour, as rich markup (``-`` for none)."""
    return f"[{STATE_STYLE.get(state or '', '')}]{state or '-'}[/]"

_consoles_lock = threading.Lock()


def __getattr__(name: str) -> Console:
    """``out`` (stdout) and ``err`` (stderr): the two consoles, made on first use (PEP 562;
    a test may replace either by assigning it)."""
    if name not in ("out", "err"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from rich.console import Console

    with _consoles_lock:
        if name not in globals():
            globals()[name] = (Console(highlight=False, soft_wrap=True) if name == "out"
                               else Console(stderr=True, highlight=False))
        return globals()[name]


def _console(name: str) -> Console:
    """``out`` or ``err`` from inside this module (where a bare name skips __getattr__)."""
    return getattr(sys.modules[__name__], name)

STYLE = {OK: "green", CHANGED: "yellow", FAILED: "red", SKIPPED: "cyan", UNREACHABLE: "magenta"}


def status_text(status: str) -> Text:
    from rich.text import Text

    return Text(status.upper(), style=STYLE.get(status, ""))


@contextmanager
def host_progress(description: str, total: int, enabled: bool = True) -> Iterator[Any]:
    """A progress bar on stderr; yields ``advance()``. Silent when stderr is not a terminal."""
    err = _console("err")
    if not enabled or not err.is_terminal:
        yield lambda: None
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=err, transient=True) as progress:
        task = progress.add_task(description, total=total)
        yield lambda: progress.advance(task)


def print_json(document: Any) -> None:
    sys.stdout.write(json.dumps(document, indent=2, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


def column(header: str, *, right: bool = False, wrap: bool = False,
           style: str | None = None) -> Column:
    """A column of :func:`table`. ``wrap``: the one or two columns of free text (a host
    name, a chip) that may fold onto more lines when the terminal is narrow; every other
    column keeps its width, and no header is ever narrower than its longest word."""
    from rich.table import Column

    return Column(header, justify="right" if right else "left", no_wrap=not wrap,
                  overflow="fold", style=style or "",
                  min_width=max(len(word) for word in header.split()))


def table(*columns: Column, title: str | None = None) -> Table:
    """An empty table in mlxops' style: a rule under the header, two spaces between
    columns, no borders (which would cost three columns of width per column)."""
    from rich import box
    from rich.table import Table

    return Table(*columns, title=title, title_justify="left", box=box.SIMPLE_HEAD,
                 show_edge=False, pad_edge=False, collapse_padding=True)


def print_table(renderable: Table, console: Console | None = None) -> None:
    """Print a table: at the terminal's width on a terminal; whole on a pipe or in a file
    (rich would assume 80 columns there and cut what does not fit)."""
    from rich.measure import Measurement

    console = console or _console("out")
    if console.is_terminal:
        console.print(renderable)
        return
    need = Measurement.get(console, console.options.update(max_width=10_000),
                           renderable).maximum
    width = console.width
    console.width = max(width, need)
    try:
        console.print(renderable)
    finally:
        console.width = width


def recap_table(results: Results, counts: dict[str, dict[str, int]] | None = None) -> Table:
    """Ansible's PLAY RECAP as a table: one row per host (task counts, or a command's rc)."""
    if counts:
        t = table(column("host", wrap=True),
                  *(column(s, right=True, style=STYLE[s]) for s in (OK, CHANGED, FAILED,
                                                                    SKIPPED)),
                  column(UNREACHABLE, style=STYLE[UNREACHABLE]), title="recap")
        for host, result in results.items():
            c = counts.get(host, {})
            t.add_row(host, *(str(c.get(s, 0)) for s in (OK, CHANGED, FAILED, SKIPPED)),
                      "yes" if result.status == UNREACHABLE else "no")
        return t
    t = table(column("host", wrap=True), column("status"), column("rc", right=True),
              column("time s", right=True), title="recap")
    for host, result in results.items():
        rc = "" if result.command is None else str(result.command.exit_code)
        t.add_row(host, status_text(result.status), rc, f"{result.duration:.2f}")
    return t


def recap(results: Results, counts: dict[str, dict[str, int]] | None = None) -> None:
    print_table(recap_table(results, counts))
