"""``mlxops trust INVENTORY``: show every host's key fingerprint and record the new ones."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from mlxops import console
from mlxops.cli.options import (
    connect_timeout_option,
    forks_option,
    inventory_argument,
    limit_option,
)
from mlxops.errors import EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE
from mlxops.transport import HostResult, Results
from mlxops.trust import (
    BLOCKED,
    KEY_CHANGED,
    NEW,
    HostKeyCheck,
    check_host_keys,
    every_check,
    record_new_keys,
)

if TYPE_CHECKING:
    from rich.text import Text

_STATE_STYLE = {"known": "green", "new": "yellow", "changed": "bold red", "local": "cyan",
                "blocked": "magenta"}


def _block(check: HostKeyCheck, result: HostResult | None = None) -> list[Text]:
    from rich.text import Text

    head = Text(check.host)
    if check.name and check.name != check.host:
        head.append(f" ({check.name})")
    head.append(": ").append(check.state, style=_STATE_STYLE[check.state])
    lines = [head]
    if check.key is not None:
        lines.append(Text(f"  {check.key_type} {check.fingerprint}"))
    if check.state == BLOCKED and result is not None:
        then = "record it, then trust goes on to this host" if check.jumps[-1].state == NEW \
            else "not scanned"
        lines.append(Text(f"  {result.message}: {then}"))
    if check.jumps and check.state != BLOCKED:
        lines.append(Text(f"  via {', '.join(hop.host for hop in check.jumps)}"))
    if check.proxy_command:
        lines.append(Text(f"  via ProxyCommand {check.proxy_command!r}: whatever it passes "
                          "through is checked by the command, not by mlxops"))
    return lines


def key_blocks(results: Results, checks: dict[str, HostKeyCheck]) -> list[Text]:
    """One block per host: ``host (address): state``, then ``  type SHA256:...`` (or why
    it could not be reached), and what it is reached through; before them, one block per
    jump host (each once, unless it is an inventory host too). A fingerprint is never cut
    or folded (it is compared by eye with what the Mac shows), and 80 columns hold the line
    whole."""
    from rich.text import Text

    hosts = {c.identity for c in checks.values() if c.key is not None}
    lines = []
    for check in every_check(checks):
        if check.host.startswith("jump host ") and check.identity not in hosts:
            lines += _block(check)
    for host, result in results.items():
        check = checks.get(host)
        if check is None:
            head = Text(host).append(": ").append("unreachable", style="magenta")
            lines += [head, Text(f"  {result.message}")]
            continue
        lines += _block(check, result)
    return lines


def _unblocked(checks: dict[str, HostKeyCheck], recorded: list[str]) -> list[str]:
    """Hosts blocked behind a jump host whose new key was just recorded: trust goes on."""
    return [host for host, check in checks.items()
            if check.state == BLOCKED and check.jumps[-1].host in recorded]


@click.command("trust")
@inventory_argument
@limit_option
@forks_option
@click.option("--yes", "-y", is_flag=True, help="Record new keys without asking.")
@connect_timeout_option
def command(inventory, limit, forks, yes, connect):
    """Show each host's SSH host-key fingerprint, and its jump hosts', and record the new
    ones in known_hosts.

    Compare the fingerprints with what each Mac shows (`ssh-keygen -lf
    /etc/ssh/ssh_host_ed25519_key.pub` on it) before saying yes. A changed key is never
    recorded: find out why it changed, then remove the old line yourself. A host behind a
    jump host whose key is new is scanned once that key is recorded.
    """
    from mlxops.inventory import load_inventory
    from mlxops.transport import Connector

    inv = load_inventory(inventory)
    pending = inv.select(limit, source="--limit")
    final: dict[str, HostResult] = {}
    every: dict[str, HostKeyCheck] = {}
    with Connector(connect) as connector:
        while pending:
            results, checks = check_host_keys(pending, connector, forks=forks)
            final.update(results.items())
            every.update(checks)
            for line in key_blocks(results, checks):
                console.out.print(line, soft_wrap=True)
            new = [c for c in every_check(checks) if c.state == NEW]
            if not new or not (yes or click.confirm(f"Record {len(new)} new host key(s)?",
                                                    default=False)):
                break
            recorded = record_new_keys(checks)
            console.out.print(f"recorded {len(recorded)} host key(s). Next: mlxops provision "
                              f"{inventory}")
            unblocked = set(_unblocked(checks, recorded))
            pending = [h for h in pending if h.name in unblocked]

    changed = sorted({c.host for c in [*every.values(), *(h for c in every.values()
                                                          for h in c.jumps)]
                      if c.state == KEY_CHANGED})
    if changed:
        console.err.print(f"[bold red]host key changed[/] for {', '.join(changed)}: not "
                          "recorded")
    if Results(final).unreachable:
        sys.exit(EXIT_UNREACHABLE)
    sys.exit(EXIT_FAILED if changed else EXIT_OK)
