"""Stop a job's ranks (and an mpi job's launcher and MPI daemons) here: the ``stop``
command (docs/node-protocol.md)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from mlxops.node import protocol
from mlxops.node.procs import Table, alive, descendants, group_alive, process_alive, process_table
from mlxops.node.rundir import mark_stopped, ranks_in, read_pid

Key = int | str  # a rank, LAUNCHER, or "orted-<pid>"


class _Target:
    """One thing to stop: a process group mlxops made (ring ranks, the launcher), or a
    process another launcher started (an mpi rank) together with its descendants."""

    def __init__(self, pid: int, table: Table):
        self.pid = pid
        self.group = any(p == pid and g == pid for p, _, g, _, _ in table)
        # Snapshot now: once the shell dies its children are re-parented out of its tree.
        self.tree = {pid} | descendants(pid, table)

    def alive(self, table: Table) -> bool:
        if self.group and group_alive(self.pid, table):
            return True
        return any(process_alive(p, table) for p in self.tree)

    def signal(self, sig: int) -> None:
        if self.group:
            try:
                os.killpg(self.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        for p in self.tree:
            try:
                os.kill(p, sig)
            except (ProcessLookupError, PermissionError):
                pass


def _wait_gone(targets: dict[Key, _Target], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        table = process_table()
        if not any(t.alive(table) for t in targets.values()):
            return
        time.sleep(0.02)


def stop(run_dir: Path, grace: float) -> protocol.StopAnswer:
    """Stop the launcher (mpi) and every rank: SIGTERM, then SIGKILL after ``grace`` seconds.

    The launcher's group goes first (mpirun forwards the signal to every rank, on every
    node); then whatever rank is still alive, by its process group (a rank mlxops spawned)
    or by its pid and descendants (a rank mpirun started); last, an MPI daemon (orted) that
    started this node's ranks and outlived them. ``ports_busy`` is left for the caller.
    """
    mark_stopped(run_dir)
    table = process_table()
    names = {p: n for p, _, _, _, n in table}
    parents = {p: pp for p, pp, _, _, _ in table}
    pids: dict[Key, int | None] = {r: read_pid(run_dir, r) for r in ranks_in(run_dir)}
    daemons: dict[Key, _Target] = {}
    for pid in pids.values():
        parent = parents.get(pid or -1)
        if parent and names.get(parent) == "orted" and alive(pid, table):
            daemons[f"orted-{parent}"] = _Target(parent, table)
    live = {r: _Target(p, table) for r, p in pids.items() if p and alive(p, table)}
    launcher_pid = read_pid(run_dir, protocol.LAUNCHER)
    deadline = time.monotonic() + grace
    if launcher_pid and alive(launcher_pid, table):
        launcher: dict[Key, _Target] = {protocol.LAUNCHER: _Target(launcher_pid, table)}
        for sig in (signal.SIGTERM, signal.SIGCONT):
            launcher[protocol.LAUNCHER].signal(sig)
        _wait_gone({**launcher, **live}, grace)
        live.update(launcher)
    for target in live.values():
        target.signal(signal.SIGTERM)
        target.signal(signal.SIGCONT)  # a stopped (SIGSTOP) rank must wake up to die
    _wait_gone(live, max(0.0, deadline - time.monotonic()))
    table = process_table()
    killed = [r for r, t in live.items() if t.alive(table)]
    for r in killed:
        live[r].signal(signal.SIGKILL)
    _wait_gone(live, 5)
    # The node's orted exits by itself once mpirun is gone; give it a moment, then make sure.
    _wait_gone(daemons, 2)
    for target in daemons.values():
        target.signal(signal.SIGTERM)
    _wait_gone(daemons, 2)
    table = process_table()
    for target in daemons.values():
        if target.alive(table):
            target.signal(signal.SIGKILL)
    _wait_gone(daemons, 2)
    table = process_table()
    return protocol.StopAnswer(
        signalled=sorted(live, key=str),
        killed=killed,
        alive=[r for r, t in {**live, **daemons}.items() if t.alive(table)],
        ports_busy=[],
    )
