"""Task ``env``: the managed ``mlxops_root/env.sh`` every rank sources (mode 600).

It exports Open MPI's TCP settings (mpi backend only), MLX_METAL_FAST_SYNCH (the
inventory's explicit choice, 0 unless set) and the host's ``mlxops_env``; every value is
shell-quoted, so the file defines values and never runs anything.
"""

from __future__ import annotations

import posixpath
import socket
from collections.abc import Mapping
from typing import Any

from mlxops import render
from mlxops.hostfacts import HostFacts
from mlxops.node.protocol.layout import ENV_FILE
from mlxops.tasks.base import Outcome, TaskContext, task
from mlxops.tasks.files import ensure_file, file_reads


def env_path(host: Any) -> str:
    return posixpath.join(host.root, ENV_FILE)


def _addresses(address: str) -> list[str]:
    """``address`` itself, or what it resolves to on the controller when it is a name."""
    try:
        infos = socket.getaddrinfo(address, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return [address]
    return [address] + [info[4][0] for info in infos]


def tcp_interface(host: Any, facts: HostFacts | None) -> str:
    """The interface carrying the host's cluster address; ValueError if none does."""
    explicit = host.var("mlxops_btl_tcp_if_include")
    if explicit:
        return explicit
    interfaces = facts.interfaces if facts else {}
    address = render.cluster_ip(host)
    for candidate in _addresses(address):
        name = render.interface_for(candidate, interfaces)
        if name:
            return name
    seen = ", ".join(f"{n} {' '.join(a)}" for n, a in interfaces.items()) or "none reported"
    raise ValueError(
        f"cluster address {address} (mlxops_ip, else ansible_host) is on no interface of "
        f"this host ({seen}); set mlxops_ip to one of its addresses or "
        "mlxops_btl_tcp_if_include to the interface")


def render_env(host: Any, facts: HostFacts | None) -> str:
    return render.env_file(render.host_environment(host, tcp_interface(host, facts)))


def env_reads(host: Any, args: Mapping[str, Any]) -> dict[str, str]:
    return file_reads([env_path(host)])


@task("env", read=env_reads)
def env_task(ctx: TaskContext, args: Mapping[str, Any]) -> Outcome:
    interfaces = ctx.facts.interfaces if ctx.facts else {}
    if not interfaces and not ctx.host.is_set("mlxops_btl_tcp_if_include"):
        return Outcome.failed("env needs the host's facts (run the facts task first)")
    try:
        text = render_env(ctx.host, ctx.facts)
    except ValueError as exc:
        return Outcome.failed(str(exc))
    return ensure_file(ctx, env_path(ctx.host), text.encode(), mode=0o600)
