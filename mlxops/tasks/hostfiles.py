"""Task ``hostfiles``: the cluster's hostfiles, rendered once and pushed to every node.

Under ``mlxops_root/hostfiles/``: ``ring.json`` (mlx.launch, ring backend), ``mpi.txt``
(Open MPI hostfile) and, when every host names its RDMA devices (``mlxops_rdma``),
``jaccl.json`` and ``jaccl-ring.json``. Each describes every selected host (``ctx.hosts``),
so each node can start a job on its own.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from typing import Any

from mlxops import render
from mlxops.errors import UserError
from mlxops.node.protocol import JACCL, JACCL_BACKENDS, JACCL_RING, MPI, RING
from mlxops.node.protocol.layout import HOSTFILES_DIR
from mlxops.tasks.base import Outcome, TaskContext, task
from mlxops.tasks.files import ensure_file, file_reads
from mlxops.transport.results import CHANGED, FAILED

FILE_NAMES = {RING: "ring.json", MPI: "mpi.txt", JACCL: "jaccl.json",
              JACCL_RING: "jaccl-ring.json"}


def hostfile_path(host: Any, backend: str) -> str:
    return posixpath.join(host.root, HOSTFILES_DIR, FILE_NAMES[backend])


def render_all(hosts: Sequence[Any], source: object = "inventory") -> dict[str, str]:
    """``{backend: text}`` for every backend the inventory can describe."""
    files = {RING: render.launch_hostfile(hosts, RING, source),
             MPI: render.mpi_hostfile(hosts)}
    if all(h.var("mlxops_rdma") for h in hosts):
        for backend in JACCL_BACKENDS:
            try:
                files[backend] = render.launch_hostfile(hosts, backend, source)
            except UserError:
                pass  # e.g. a full mesh is not described: jaccl-ring may still be
    return files


def check_args(args: Mapping[str, Any]) -> None:
    wanted = args.get("backends")
    if wanted is not None and (not isinstance(wanted, list)
                               or any(b not in FILE_NAMES for b in wanted)):
        raise ValueError(f"backends: want a list of {', '.join(FILE_NAMES)}, got {wanted!r}")


def hostfiles_reads(host: Any, args: Mapping[str, Any]) -> dict[str, str]:
    """Every hostfile the task may write (which ones it does depends on the inventory)."""
    return file_reads(hostfile_path(host, backend)
                      for backend in args.get("backends") or FILE_NAMES)


@task("hostfiles", args=["backends"], read=hostfiles_reads)
def hostfiles_task(ctx: TaskContext, args: Mapping[str, Any]) -> Outcome:
    try:
        files = render_all(ctx.hosts, getattr(ctx.inventory, "path", "inventory"))
    except UserError as exc:
        return Outcome.failed(str(exc))
    wanted = args.get("backends")
    if wanted:
        files = {b: t for b, t in files.items() if b in wanted}
    changed, diffs, messages = False, [], []
    for backend, text in files.items():
        outcome = ensure_file(ctx, hostfile_path(ctx.host, backend), text.encode(), mode=0o644)
        if outcome.status == FAILED:
            return outcome
        changed = changed or outcome.status == CHANGED
        diffs.append(outcome.diff)
        if outcome.status == CHANGED:
            messages.append(outcome.message)
    diff = "".join(diffs)
    if changed:
        return Outcome.changed("; ".join(messages), diff=diff)
    return Outcome.ok(f"{len(files)} hostfiles up to date")


hostfiles_task.check_args = check_args  # type: ignore[attr-defined]
