"""``mlxops selftest INVENTORY``: trust, provision, check, bench, a job with a killed rank,
stop; one summary to paste into a bug report (the steps: :mod:`mlxops.selftest`)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from mlxops import console
from mlxops.cli.options import (
    connect_options,
    forks_option,
    inventory_argument,
    json_option,
    limit_option,
)
from mlxops.selftest.choices import DEFAULT_TIMEOUT, NAME, SKIPPABLE


@click.command("selftest")
@inventory_argument
@limit_option
@click.option("--skip", metavar="STEP,..", default="",
              help=f"Leave out these steps: {', '.join(SKIPPABLE)} (job takes its stop with "
                   "it).")
@click.option("--keep", is_flag=True,
              help=f"Keep the stopped job's run directories and record (mlxops logs {NAME}, "
                   f"mlxops report {NAME}).")
@click.option("--timeout", type=click.FloatRange(10, 3600), default=DEFAULT_TIMEOUT,
              show_default=True, metavar="SECONDS",
              help="How long the job step may take, launch to recovered.")
@forks_option
@json_option
@connect_options
def command(inventory, limit, skip, keep, timeout, forks, as_json, connect):
    """Run on your own nodes what mlxops' tests run: trust status, provision, check, a short
    bench, a job with one rank killed (kill -9) and recovered by the watchdog, stop.

    Prints one summary (hosts, macOS and MLX versions, each step's result and time, the
    links' figures, the recovery time) to paste into a bug report, and leaves nothing
    running. Exit 0 every step passed, 1 one failed, 2 bad input (nothing contacted),
    3 a host unreachable, 130 Ctrl-C (after stopping the job).

    \b
    Example:
      mlxops selftest inventory.yml --limit 'macs[0:3]' --skip bench
    """
    from mlxops.selftest.run import Options, parse_skip, run_selftest
    from mlxops.selftest.summary import render_text

    options = Options(inventory=Path(inventory), limit=limit, skip=parse_skip(skip),
                      keep=keep, timeout=timeout, forks=forks,
                      connect=connect)
    progress = console.err.is_terminal

    def on_event(message: str) -> None:
        if progress:
            console.err.print(f"selftest: {message}", style="dim", markup=False)

    summary = run_selftest(options, on_event)
    if as_json:
        console.print_json(summary.to_dict())
    else:
        sys.stdout.write(render_text(summary))
        sys.stdout.flush()
    sys.exit(summary.exit_code)
