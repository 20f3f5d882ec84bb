"""``mlxops plan JOB``: memory and batch plan per node."""

from __future__ import annotations

import sys

import click
from rich.table import Table

from mlxops import console
from mlxops.cli.options import connector_from, host_key_options, json_option
from mlxops.errors import EXIT_FAILED
from mlxops.jobs.plan import plan_job
from mlxops.jobs.spec import load_job

GB = 1024**3


@click.command("plan")
@click.argument("job", type=click.Path(dir_okay=False))
@click.option("--refresh", is_flag=True, help="Ask every node for its memory, ignoring cached "
                                                "facts.")
@json_option
@host_key_options
def command(job, refresh, as_json, accept_new_host_keys, connect_timeout):
    """Per node: parameters, gradients, optimizer state and activations of one rank, and the
    micro-batch, accumulation and checkpointing that fit its memory."""
    spec = load_job(job)
    with connector_from(accept_new_host_keys, connect_timeout) as connector:
        plans, results = plan_job(spec, connector, refresh=refresh)
    fits = all(p.plan.fits for p in plans)
    if as_json:
        console.print_json({"name": spec.name, "fits": fits,
                            "nodes": [p.to_dict() for p in plans],
                            "unreachable": {h: results[h].message for h in results.unreachable}})
    else:
        table = Table(show_edge=False, pad_edge=False)
        for col in ("host", "chip", "memory", "ranks", "params", "weights+grads+optim",
                    "activations", "per rank", "micro x accum", "grad ckpt", "fits"):
            table.add_column(col)
        for p in plans:
            m = p.plan
            table.add_row(
                p.host, p.chip, f"{p.memory_bytes / GB:.0f} GB", str(p.ranks),
                f"{m.params / 1e6:.1f}M",
                f"{(m.param_bytes + m.grad_bytes + m.optimizer_bytes) / GB:.2f} GB",
                f"{m.activation_bytes / GB:.2f} GB",
                f"{m.total_bytes / GB:.2f} / {m.budget_bytes / GB:.1f} GB",
                f"{m.micro_batch} x {m.accumulation}", "on" if m.grad_checkpoint else "off",
                "[green]yes[/]" if m.fits else "[bold red]NO[/]")
        console.out.print(table)
        for host in results.unreachable:
            console.err.print(f"{host}: unreachable: {results[host].message}")
        if plans:
            m = plans[0].plan
            console.out.print(f"\nglobal batch {m.micro_batch * m.accumulation * m.world_size} "
                              f"= micro_batch {m.micro_batch} x accumulation {m.accumulation}"
                              f" x world {m.world_size}. Next: mlxops launch {job}")
    if results.exit_code:
        sys.exit(results.exit_code)
    sys.exit(0 if fits else EXIT_FAILED)
