"""``mlxops provision INVENTORY``: run playbooks/provision.yml on the selected hosts.

Everything is validated — playbook, inventory, --limit, --tags — before any host is
contacted; then the play runs task by task (Ansible's linear strategy) and prints a line
per host per task, diffs under ``--diff``, the recap, and the next command to run.
"""

from __future__ import annotations

import sys
import threading

import click
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from mlxops import console
from mlxops.cli.options import (
    connect_options,
    forks_option,
    inventory_argument,
    json_option,
    limit_option,
)
from mlxops.inventory import load_inventory
from mlxops.paths import playbooks_dir
from mlxops.playbook import (
    Callbacks,
    PlayTask,
    TaskReport,
    load_playbook,
    outcome_of,
    parse_tag_list,
    run_play,
)
from mlxops.tasks.facts import save_facts
from mlxops.transport import Connector, HostResult
from mlxops.transport.results import OK

NEXT_STEP = "next: mlxops launch job.yml"


class Printer(Callbacks):
    """Ansible-style lines as results arrive: ``changed: [node2] => message``."""

    def __init__(self, show_diff: bool):
        self.show_diff = show_diff
        self._lock = threading.Lock()

    def task_start(self, task: PlayTask, hosts) -> None:
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


@click.command("provision")
@inventory_argument
@limit_option
@click.option("--tags", "-t", metavar="T,..", help="Run only tasks with these tags.")
@click.option("--skip-tags", metavar="T,..", help="Skip tasks with these tags.")
@click.option("--check", "-C", is_flag=True, help="Report what would change; change nothing.")
@click.option("--diff", "-D", is_flag=True, help="Show unified diffs of managed files.")
@forks_option
@json_option
@click.option("--playbook", type=click.Path(dir_okay=False), default=None,
              help="Another playbook to run (default: the bundled provision.yml).")
@connect_options
def command(inventory, limit, tags, skip_tags, check, diff, forks, as_json, playbook,
            connect):
    """Make every selected Mac ready to train: facts, env, Python+MLX, hostfiles, code.

    Idempotent: a re-run changes nothing. Exit 0 all good, 1 a task failed,
    2 bad input (nothing done), 3 a host was unreachable.

    \b
    Example:
      mlxops provision inventory.yml --check --diff
    """
    # Validate everything before connecting: a bad input is exit 2 with no host touched.
    play = load_playbook(playbook or playbooks_dir() / "provision.yml")
    inv = load_inventory(inventory)
    hosts = inv.select(limit, source="--limit")
    tag_set = parse_tag_list(tags, "--tags", play)
    skip_set = parse_tag_list(skip_tags, "--skip-tags", play)
    total = len(hosts) * len(play.tasks)
    with Connector(connect) as connector, \
            console.host_progress("provisioning", total, enabled=as_json) as advance:
        if as_json:
            callbacks: Callbacks = Silent(advance)
        else:
            callbacks = Printer(diff)
            mode = " (check mode: nothing is changed)" if check else ""
            console.out.print(f"[bold]PLAY \\[{escape(play.name)}][/] {len(hosts)} hosts{mode}")
        result = run_play(play, hosts, inv, connector, tags=tag_set, skip_tags=skip_set,
                          check=check, diff=diff, forks=forks, callbacks=callbacks)
    for name, facts in result.facts.items():
        if facts:
            save_facts(name, facts)
    if as_json:
        console.print_json(result.to_json())
    else:
        console.out.print()
        console.recap(result.results, result.counts)
        console.out.print(f"{result.duration:.2f}s", style="dim")
        if result.exit_code == 0 and not check:
            console.out.print(NEXT_STEP, style="bold")
    sys.exit(result.exit_code)
