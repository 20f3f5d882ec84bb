"""What ``mlxops provision`` prints while the play runs: Ansible-style lines per host per
task (``changed: [node2] => message``), diffs, warnings, a task's table. Imported when the
command runs (its play is imported with it), not by ``--help``."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from mlxops import console
from mlxops.playbook import Callbacks, PlayTask, TaskReport, outcome_of
from mlxops.transport import HostResult
from mlxops.transport.results import OK

if TYPE_CHECKING:
    from rich.table import Table


class Printer(Callbacks):
    """Ansible-style lines as results arrive: ``changed: [node2] => message``."""

    def __init__(self, show_diff: bool):
        self.show_diff = show_diff
        self._lock = threading.Lock()

    def task_start(self, task: PlayTask, hosts) -> None:
        from rich.markup import escape

        console.out.print()
        console.out.print(f"[bold]TASK \\[{escape(task.name)}][/] ", end="")
        console.out.print(f"({task.spec.name}, {len(hosts)} hosts)", style="dim",
                          markup=False)

    def host_result(self, task: PlayTask, result: HostResult) -> None:
        outcome = outcome_of(result)
        style = console.STYLE.get(result.status, "")
        line = f"{result.status}: [{result.host}]"
        if result.message and (result.status != OK or task.spec.name == "facts"):
            line += f" => {result.message}"
        with self._lock:
            console.out.print(line, style=style, markup=False)
            if outcome is None:
                return
            for warning in outcome.data.get("warnings", []):
                console.out.print(f"[WARNING]: {result.host}: {warning}", style="bold yellow",
                                  markup=False)
            if self.show_diff and outcome.diff:
                for diff_line in outcome.diff.rstrip("\n").splitlines():
                    colour = ("green" if diff_line.startswith("+") else
                              "red" if diff_line.startswith("-") else
                              "cyan" if diff_line.startswith("@@") else "")
                    console.out.print(diff_line, style=colour, markup=False)

    def task_end(self, report: TaskReport) -> None:
        # A cluster task (e.g. skew) may attach one table for everyone: print it once.
        for result in report.results.values():
            outcome = outcome_of(result)
            if outcome is not None and outcome.data.get("table"):
                _print_table(outcome.data["table"])
                break


def task_table(spec: dict) -> Table:
    """A task's table (``{"title", "columns", "rows", "marks"}``), the values that differ in
    bold red."""
    from rich.text import Text

    table = console.table(console.column(spec["columns"][0], wrap=True),
                          *(console.column(c) for c in spec["columns"][1:]),
                          title=spec.get("title"))
    marks = spec.get("marks", {})
    for row in spec["rows"]:
        table.add_row(*(Text(c, style="bold red" if i in marks.get(row[0], []) else "")
                        for i, c in enumerate(row)))
    return table


def _print_table(spec: dict) -> None:
    console.print_table(task_table(spec))


class Silent(Callbacks):
    def __init__(self, advance):
        self.advance = advance

    def host_result(self, task: PlayTask, result: HostResult) -> None:
        self.advance()
