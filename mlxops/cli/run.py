"""``mlxops run INVENTORY [--limit] [--json] -- COMMAND...``: an ad-hoc command on hosts."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from mlxops import console
from mlxops.cli.options import (
    connect_options,
    forks_option,
    inventory_argument,
    json_option,
    limit_option,
)
from mlxops.transport.results import OK, UNREACHABLE

if TYPE_CHECKING:
    from mlxops.transport import HostResult


def _print_host(result: HostResult) -> None:
    cmd = result.command
    rc = f" | rc={cmd.exit_code}" if cmd is not None else ""
    head = console.status_text(result.status)
    console.out.print(f"[bold]{result.host}[/] | ", head, f"{rc} >>", sep="")
    if cmd is not None:
        if cmd.stdout:
            console.out.print(cmd.stdout.rstrip("\n"), markup=False)
        if cmd.stderr:
            console.out.print(cmd.stderr.rstrip("\n"), markup=False, style="red")
    if result.message and result.status != OK:
        console.out.print(result.message, markup=False, style=console.STYLE[result.status])


@click.command("run", context_settings={"ignore_unknown_options": True})
@inventory_argument
@limit_option
@forks_option
@click.option("--timeout", "-t", type=click.FloatRange(0, None), default=0,
              help="Seconds before a host's command is abandoned (0: no limit).")
@click.option("--become", "-b", is_flag=True,
              help="Run COMMAND as root with `sudo -n` (as hosts with ansible_become do "
                   "anyway); without passwordless sudo it fails instead of prompting.")
@json_option
@connect_options
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def command(inventory, limit, forks, timeout, become, as_json, connect, command):
    """Run COMMAND on every selected host, in parallel, and show each host's output.

    COMMAND's words are passed quoted, never through a shell: use `sh -c '...'` for pipes.

    \b
    Example:
      mlxops run inventory.yml --limit studios -- sysctl hw.memsize
    """
    from mlxops.adhoc import run_command
    from mlxops.inventory import load_inventory
    from mlxops.transport import Connector

    inv = load_inventory(inventory)
    hosts = inv.select(limit, source="--limit")
    with Connector(connect) as connector, \
            console.host_progress("running", len(hosts), enabled=True) as advance:
        def on_result(result: HostResult) -> None:
            if not as_json:
                _print_host(result)
            advance()

        results = run_command(hosts, list(command), connector, forks=forks,
                              timeout=timeout or None, become=become, on_result=on_result)
    if as_json:
        console.print_json({"hosts": {
            name: {
                "status": r.status,
                "unreachable": r.status == UNREACHABLE,
                "rc": None if r.command is None else r.command.exit_code,
                "stdout": None if r.command is None else r.command.stdout,
                "stderr": None if r.command is None else r.command.stderr,
                "message": r.message,
                "duration": round(r.duration, 3),
            } for name, r in results.items()}})
    else:
        console.out.print()
        console.recap(results)
    sys.exit(results.exit_code)
