"""``mlxops hostfile INVENTORY [--backend] [--limit] [-o PATH]``: render a hostfile locally.

No SSH: the same text the ``hostfiles`` task pushes to nodes, for ``mlx.launch --hostfile``
(ring, jaccl, jaccl-ring) or ``mpirun --hostfile`` (mpi).
"""

from __future__ import annotations

import os

import click

from mlxops.cli.options import inventory_argument, limit_option
from mlxops.errors import bad_input
from mlxops.node.protocol import BACKENDS, DEFAULT_BACKEND, MPI


@click.command("hostfile")
@inventory_argument
@click.option("--backend", "-b", type=click.Choice(BACKENDS), default=DEFAULT_BACKEND,
              show_default=True, help="mlx.launch hostfile JSON, or the MPI hostfile for mpi.")
@limit_option
@click.option("--output", "-o", metavar="PATH", type=click.Path(dir_okay=False),
              help="Write here instead of stdout.")
@click.option("--order", metavar="BENCH.json", type=click.Path(dir_okay=False),
              help="Hosts in the ring order a saved `mlxops bench` result chose "
                   "(~/.mlxops/bench/*.json) instead of inventory order.")
def command(inventory, backend, limit, output, order):
    """Render the hostfile of the selected hosts for BACKEND (one entry per rank).

    \b
    Example:
      mlxops hostfile inventory.yml -o hostfile.json
      mlx.launch --hostfile hostfile.json --python /opt/homebrew/bin/python3 train.py
    """
    from mlxops import render
    from mlxops.bench.results import ring_order
    from mlxops.inventory import load_inventory

    inv = load_inventory(inventory)
    # Nothing connects from here (mlx.launch's own ssh does not read the key file either).
    hosts = inv.select(limit, source="--limit", check_files=False)
    if order:
        hosts = render.in_order(hosts, ring_order(order), source=order, known=inv.hosts)
    if backend == MPI:
        text = render.mpi_hostfile(hosts)
    else:
        text = render.launch_hostfile(hosts, backend, source=inv.path)
    if not output:
        click.echo(text, nl=not text.endswith("\n"))
        return
    tmp = f"{output}.tmp{os.getpid()}"
    try:
        with open(tmp, "w") as fh:
            fh.write(text)
        os.replace(tmp, output)
    except OSError as exc:
        raise bad_input(output, None, f"cannot write: {exc.strerror or exc}") from None
