"""``mlxops trust INVENTORY``: show every host's key fingerprint and record the new ones."""

from __future__ import annotations

import sys

import click
from rich.measure import Measurement
from rich.table import Table

from mlxops import console
from mlxops.cli.options import forks_option, inventory_argument, limit_option
from mlxops.errors import EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE
from mlxops.inventory import load_inventory
from mlxops.transport import ConnectOptions, Connector
from mlxops.trust import KEY_CHANGED, NEW, check_host_keys, record_new_keys

_STATE_STYLE = {"known": "green", "new": "yellow", "changed": "bold red", "local": "cyan"}


def _print_uncut(table: Table) -> None:
    """Print the table whole: a fingerprint cut to fit 80 columns cannot be compared."""
    out = console.out
    need = Measurement.get(out, out.options.update(max_width=10_000), table).maximum
    width = out.width
    out.width = max(width, need)
    try:
        out.print(table)
    finally:
        out.width = width


@click.command("trust")
@inventory_argument
@limit_option
@forks_option
@click.option("--yes", "-y", is_flag=True, help="Record new keys without asking.")
@click.option("--connect-timeout", type=click.FloatRange(0.1, 600), default=10.0,
              show_default=True)
def command(inventory, limit, forks, yes, connect_timeout):
    """Show each host's SSH host-key fingerprint and record the new ones in known_hosts.

    Compare the fingerprints with what each Mac shows (`ssh-keygen -lf
    /etc/ssh/ssh_host_ed25519_key.pub` on it) before saying yes. A changed key is never
    recorded: find out why it changed, then remove the old line yourself.
    """
    inv = load_inventory(inventory)
    hosts = inv.select(limit, source="--limit")
    with Connector(ConnectOptions(connect_timeout=connect_timeout)) as connector:
        results, checks = check_host_keys(hosts, connector, forks=forks)

    table = Table(show_edge=False, pad_edge=False)
    for column in ("host", "address", "type", "fingerprint", "state"):
        table.add_column(column)
    for host, result in results.items():
        check = checks.get(host)
        if check is None:
            table.add_row(host, "", "", result.message, "[magenta]unreachable[/]")
            continue
        table.add_row(host, check.name, check.key_type, check.fingerprint,
                      f"[{_STATE_STYLE[check.state]}]{check.state}[/]")
    _print_uncut(table)

    new = [h for h, c in checks.items() if c.state == NEW]
    if new and (yes or click.confirm(f"Record {len(new)} new host key(s)?", default=False)):
        recorded = record_new_keys(checks)
        console.out.print(f"recorded {len(recorded)} host key(s). Next: mlxops provision "
                          f"{inventory}")
    changed = [h for h, c in checks.items() if c.state == KEY_CHANGED]
    if changed:
        console.err.print(f"[bold red]host key changed[/] for {', '.join(changed)}: not "
                          "recorded")
    if results.unreachable:
        sys.exit(EXIT_UNREACHABLE)
    sys.exit(EXIT_FAILED if changed else EXIT_OK)
