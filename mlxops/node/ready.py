"""What a node says when asked whether it is ready to train: the ``ready`` command of
``mlxops check`` (docs/node-protocol.md). Reads only; nothing on the node changes."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from mlxops.node import protocol
from mlxops.node.memory import recommended_working_set
from mlxops.node.ports import busy_ports
from mlxops.node.preflight import open_mpi
from mlxops.node.status import leftovers


def running_ranks(root: Path) -> list[protocol.RunningRank]:
    """The live processes of every job under ``<root>/runs/`` (by their pid files)."""
    runs = root / protocol.RUNS_DIR
    if not runs.is_dir():
        return []
    found = []
    for run_dir in sorted(p for p in runs.iterdir() if p.is_dir()):
        found += [protocol.RunningRank(run_dir.name, x.rank, x.pid) for x in leftovers(run_dir)]
    return found


def disk_free(path: Path) -> int | None:
    """Free bytes on the filesystem ``path`` is (or would be) on: its nearest existing
    ancestor's, so a root not made yet still has an answer."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            try:
                return shutil.disk_usage(candidate).free
            except OSError:
                return None
    return None


def ready(root: Path, *, ip: str, ports: list[int], mpi: bool) -> protocol.ReadyAnswer:
    now = time.time()
    mpirun, libname = open_mpi() if mpi else (None, None)
    return protocol.ReadyAnswer(
        now=now,
        disk_free=disk_free(root),
        ports_busy=busy_ports(ip, ports) if ip else [],
        running=running_ranks(root),
        mpirun=mpirun,
        mpi_libname=libname,
        working_set=recommended_working_set(),
    )
