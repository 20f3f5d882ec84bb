"""``mlxops provision INVENTORY``: run playbooks/provision.yml on the selected hosts.

Everything is validated — playbook, inventory, --limit, --tags — before any host is
contacted; then the play runs task by task (Ansible's linear strategy) and prints a line
per host per task, diffs under ``--diff``, the recap, and the next command to run.
"""

from __future__ import annotations

import sys

import click

from mlxops import console
from mlxops.cli.options import (
    connect_options,
    forks_option,
    inventory_argument,
    json_option,
    limit_option,
)

NEXT_STEP = "next: mlxops launch job.yml"


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
    from mlxops.cli.provision_output import Printer, Silent
    from mlxops.inventory import load_inventory
    from mlxops.paths import playbooks_dir
    from mlxops.playbook import Callbacks, load_playbook, parse_tag_list, run_play
    from mlxops.tasks.facts import save_facts
    from mlxops.transport import Connector

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
            from rich.markup import escape

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
