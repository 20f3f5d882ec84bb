"""``mlxops sandbox up|down|status|sleep|wake``: a fake cluster of N nodes on this Linux machine.

Each node is a network namespace with its own address, sshd and home directory, so the
rest of mlxops (and its integration tests) runs against it as against real Macs.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

import click

from mlxops import console
from mlxops.errors import UserError
from mlxops.sandbox.darwin import FLAVOURS
from mlxops.sandbox.layout import DEFAULT_PREFIX, DEFAULT_SUBNET, LOGIN_SHELLS

if TYPE_CHECKING:
    from mlxops.sandbox import Sandbox

_dir_option = click.option(
    "--dir", "state_dir", type=click.Path(file_okay=False), envvar="MLXOPS_SANDBOX_DIR",
    default="/var/lib/mlxops-sandbox", show_default=True,
    help="State directory (keys, known_hosts, ssh_config, inventory.yml, state.json). "
         "Env: MLXOPS_SANDBOX_DIR.")


@click.group("sandbox")
def command() -> None:
    """Fake Mac nodes on Linux (network namespaces + sshd); needs root."""


@command.command("up")
@click.option("--nodes", "-n", type=click.IntRange(1, 240), required=True,
              help="How many nodes (node1..nodeN).")
@click.option("--rate", "rates", metavar="[NODE=]RATE", multiple=True,
              help="Shape each node's link both ways with tc tbf, e.g. 200mbit, 1gbit; "
                   "NODE=RATE for one node (repeat: --rate 400mbit --rate node3=100mbit).")
@_dir_option
@click.option("--subnet", default=DEFAULT_SUBNET, show_default=True,
              help="IPv4 subnet: .1 is this machine (on the bridge), node i is .(10+i).")
@click.option("--prefix", default=DEFAULT_PREFIX, show_default=True,
              help="Name prefix of the bridge, namespaces and veths (tells sandboxes apart).")
@click.option("--login-shell", type=click.Choice(sorted(LOGIN_SHELLS)), default=None,
              help="The node user's login shell, which sshd runs every remote command "
                   "under: zsh as on a stock Mac (its own account, mlxnodez). Default: "
                   "bash, zsh with --flavour macos.")
@click.option("--flavour", type=click.Choice(FLAVOURS), default="linux", show_default=True,
              help="macos: nodes that answer as a Mac where mlxops asks (uname, sw_vers, "
                   "sysctl, pmset, vm_stat, ioreg, ifconfig, BSD ps/stat, bsdtar as tar; "
                   "output recorded on a real Mac) and have no /proc.")
def up(nodes: int, rates: tuple[str, ...], state_dir: str, subnet: str, prefix: str,
       login_shell: str | None, flavour: str) -> None:
    """Start NODES fake nodes and write a ready-to-use inventory.

    Refuses when a sandbox already runs in DIR: run `mlxops sandbox down` first. The
    first run builds the node interpreter (a venv with the controller's mlx version)
    under /var/cache/mlxops-sandbox; later runs reuse it.
    """
    from mlxops.sandbox import Sandbox

    start = time.monotonic()
    login_shell = login_shell or ("zsh" if flavour == "macos" else "bash")
    box = Sandbox(state_dir, subnet=subnet, prefix=prefix, login_shell=login_shell,
                  flavour=flavour, log=lambda m: console.err.print(m))
    info = box.up(nodes, rates=rates)
    elapsed = time.monotonic() - start
    out = console.out
    out.print(f"sandbox up: {len(info.nodes)} node(s) in {elapsed:.1f}s "
              f"(controller {info.controller_ip})")
    for name, ip in info.nodes.items():
        rate = box.rate(name)
        out.print(f"  {name:<8} {ip}{'  ' + rate if rate else ''}")
    out.print(f"inventory:  {info.inventory_path}")
    out.print(f"try:        ssh -F {info.ssh_config_path} {next(iter(info.nodes))} true")
    out.print(f"            mlxops run {info.inventory_path} -- uname -a")
    out.print(f"stop with:  mlxops sandbox down --dir {info.dir}")


@command.command("down")
@_dir_option
def down(state_dir: str) -> None:
    """Stop every node and remove what `up` created (the cached venv stays). Idempotent."""
    from mlxops.sandbox import Sandbox

    box = Sandbox(state_dir)
    count = len(box.nodes)
    box.down()
    console.out.print(f"sandbox down: removed {count} node(s)" if count
                      else f"sandbox down: nothing running in {state_dir}")


@command.command("sleep")
@click.argument("node")
@_dir_option
def sleep(node: str, state_dir: str) -> None:
    """Put NODE to sleep as a Mac falls asleep: every process of it frozen (sshd, sessions,
    ranks), its connections open but silent, until `wake`."""
    box = _running(state_dir, node)
    box.sleep_node(node)
    console.out.print(f"{node} asleep (every process frozen): `mlxops sandbox wake {node}`")


@command.command("wake")
@click.argument("node")
@_dir_option
def wake(node: str, state_dir: str) -> None:
    """Wake NODE: its processes go on where they were."""
    box = _running(state_dir, node)
    box.wake_node(node)
    console.out.print(f"{node} awake")


def _running(state_dir: str, node: str) -> Sandbox:
    """The sandbox in DIR, with NODE in it; a one-line error (exit 2) otherwise."""
    from mlxops.sandbox import Sandbox

    box = Sandbox(state_dir)
    if node not in box.nodes:
        known = ", ".join(box.nodes) or "none: no sandbox there"
        raise UserError(f"{state_dir}: no node {node!r} in the sandbox (nodes: {known})")
    return box


@command.command("status")
@_dir_option
@click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")
def status(state_dir: str, as_json: bool) -> None:
    """Show the nodes of the sandbox in DIR and whether each sshd is up."""
    from mlxops.sandbox import Sandbox

    box = Sandbox(state_dir)
    nodes = [{"name": n, "ip": box.ip(n), "sshd_pid": box.sshd_pid(n),
              "sshd_up": box.sshd_alive(n)} for n in box.nodes]
    doc = {"dir": str(box.dir), "running": box.is_running(), "flavour": box.flavour,
           "nodes": nodes,
           "inventory": str(box.inventory_path) if nodes else None}
    if as_json:
        click.echo(json.dumps(doc))
        return
    if not nodes:
        console.out.print(f"no sandbox in {box.dir}")
        return
    mac = " (Mac-like nodes)" if box.is_mac else ""
    console.out.print(f"sandbox in {box.dir}{mac}: inventory {box.inventory_path}")
    for node in nodes:
        state = "[green]up[/]" if node["sshd_up"] else "[red]down[/]"
        console.out.print(f"  {node['name']:<8} {node['ip']:<15} sshd {state}")
