"""Serving commands: ``mlxops serve NAME`` (a local port forwarded to a serve job's server)
and ``mlxops export RUN`` (a bundled-trainer checkpoint in mlx-lm's layout)."""

from __future__ import annotations

import threading
from pathlib import Path

import click

from mlxops import console
from mlxops.cli.options import connect_options, json_option
from mlxops.errors import UserError
from mlxops.jobs.record import inventory_hosts, load_record
from mlxops.node.protocol.serve import EXPORT_ARCHES
from mlxops.transport import Connector
from mlxops.transport.forward import Forward


@click.command("serve")
@click.argument("name")
@click.option("--port", "-p", "local_port", type=click.IntRange(0, 65535), default=0,
              help="Local port to listen on (127.0.0.1); 0 picks a free one.")
@connect_options
def serve(name, local_port, connect):
    """Forward a local port to serve job NAME's server and print its base URL.

    The forward runs over mlxops's SSH connection to the serving node (host key verified);
    the server itself stays on the node's loopback. Ctrl-C ends the forward, not the job.
    """
    record = load_record(name)
    listens = record.workload.listens() if record.workload is not None else None
    if listens is None:
        raise UserError(f"job {name!r} is not a serve job (no 'serve:' section)")
    address, port = listens
    host = inventory_hosts(record)[record.ranks[0].host]
    with Connector(connect) as connector:
        conn = connector.connect(host)
        conn.run("true", timeout=30)  # the host and its key, checked before we listen
        try:
            forward = Forward(conn, address, port, local_port=local_port)
        except OSError as exc:
            raise UserError(f"--port: cannot listen on 127.0.0.1:{local_port}: "
                            f"{exc.strerror}") from None
        with forward:
            console.out.print(f"{forward.url}/v1", soft_wrap=True, highlight=False)
            console.err.print(f"forwarding 127.0.0.1:{forward.local_port} to "
                              f"{address}:{port} on {host.name} "
                              "(Ctrl-C to stop)")
            try:
                threading.Event().wait()
            except KeyboardInterrupt:
                console.err.print("forward closed; the server keeps running "
                                  f"(mlxops stop {name} stops it)")


@click.command("export")
@click.argument("run")
@click.option("--step", type=click.IntRange(1), default=None,
              help="The checkpoint of this step (default: the newest).")
@click.option("--best", is_flag=True,
              help="The best checkpoint (best/: the lowest validation loss).")
@click.option("--arch", type=click.Choice(EXPORT_ARCHES), default=EXPORT_ARCHES[0],
              show_default=True,
              help="mlx-lm architecture to write (qwen2: the same function, pipeline-able).")
@click.option("--output", "-o", required=True, type=click.Path(file_okay=False),
              help="Local directory to write (new or empty).")
@json_option
@connect_options
def export(run, step, best, arch, output, as_json, connect):
    """Write job RUN's bundled-trainer checkpoint in mlx-lm's layout (config.json,
    safetensors, a byte-level tokenizer.json): mlx_lm.load, generate and server read it."""
    from mlxops.jobs.export import export_run

    if best and step is not None:
        raise UserError("--best and --step: choose one")
    with Connector(connect) as connector:
        done = export_run(run, Path(output), connector, step=step, best=best, arch=arch)
    if as_json:
        console.print_json(done.to_dict())
    else:
        console.out.print(f"exported step {done.step} of {run} ({done.arch}) to {done.out}: "
                          f"{', '.join(done.files)}", soft_wrap=True, highlight=False)


commands = [serve, export]
