"""``mlxops trust INVENTORY``: show every host's key fingerprint and record the new ones."""

from __future__ import annotations

import sys

import click
from rich.text import Text

from mlxops import console
from mlxops.cli.options import forks_option, inventory_argument, limit_option
from mlxops.errors import EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE
from mlxops.inventory import load_inventory
from mlxops.transport import ConnectOptions, Connector, Results
from mlxops.trust import KEY_CHANGED, NEW, HostKeyCheck, check_host_keys, record_new_keys

_STATE_STYLE = {"known": "green", "new": "yellow", "changed": "bold red", "local": "cyan"}


def key_blocks(results: Results, checks: dict[str, HostKeyCheck]) -> list[Text]:
    """One block per host: ``host (address): state``, then ``  type SHA256:...`` (or why
    it could not be reached). A fingerprint is never cut or folded (it is compared by eye
    with what the Mac shows), and 80 columns hold the line whole."""
    lines = []
    for host, result in results.items():
        check = checks.get(host)
        head = Text(host)
        if check is None:
            head.append(": ").append("unreachable", style="magenta")
            lines += [head, Text(f"  {result.message}")]
            continue
        if check.name and check.name != host:
            head.append(f" ({check.name})")
        head.append(": ").append(check.state, style=_STATE_STYLE[check.state])
        lines.append(head)
        if check.key is not None:
            lines.append(Text(f"  {check.key_type} {check.fingerprint}"))
    return lines


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

    for line in key_blocks(results, checks):
        console.out.print(line, soft_wrap=True)

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
