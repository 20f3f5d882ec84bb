"""``mlxops fetch NAME``: a fine-tuning job's adapters, to the controller (mlxops.jobs.fetch)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from mlxops import console
from mlxops.cli.options import connect_options, json_option
from mlxops.errors import EXIT_OK
from mlxops.jobs.fetch import fetch as fetch_adapters
from mlxops.jobs.record import load_record
from mlxops.transport import Connector


@click.command("fetch")
@click.argument("name")
@click.option("--output", "-o", "output", type=click.Path(file_okay=False), default=None,
              help="Directory to write adapters.safetensors and adapter_config.json into "
                   "(default: ./NAME-adapters).")
@click.option("--best", is_flag=True,
              help="The checkpoint of the lowest validation loss (best/), not the newest.")
@click.option("--step", type=click.IntRange(0), default=None,
              help="The checkpoint of this step, not the newest.")
@json_option
@connect_options
def command(name, output, best, step, as_json, connect):
    """Bring fine-tuning job NAME's adapters (or full weights) to this machine, in mlx-lm's
    layout: mlx_lm.generate --adapter-path DIR takes them as they are."""
    record = load_record(name)
    out = Path(output) if output else Path(f"{name}-adapters")
    with Connector(connect) as connector:
        got = fetch_adapters(record, connector, out, best=best, step=step)
    if as_json:
        console.print_json({"name": name, "host": got.host, "source": got.source,
                            "step": got.step, "out": str(got.out), "files": got.files})
    else:
        size = sum(got.files.values())
        step_text = f"step {got.step}" if got.step is not None else got.source
        console.out.print(f"{name}: {got.source} ({step_text}) from {got.host} -> {got.out} "
                          f"({size:,} bytes)")
        console.out.print(f"Next: mlx_lm.generate --model BASE --adapter-path {got.out} "
                          "--prompt ...")
    sys.exit(EXIT_OK)
