"""The node's process table, and whether a rank's process (or process group) is alive."""

from __future__ import annotations

import os
from pathlib import Path

from mlxops.node.host import has_proc

#: (pid, ppid, pgid, state, name) of every process; state 'Z' is a zombie.
Table = list[tuple[int, int, int, str, str]]


def process_table() -> Table:
    """(pid, ppid, pgid, state, name) of every process; state 'Z' is a zombie. From
    ``/proc`` where the node has one (no subprocess needed), else BSD ``ps`` (macOS)."""
    table = []
    if has_proc():
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            # pid (comm) state ppid pgrp ...: comm may hold spaces, so split after ')'.
            head, tail = stat.rsplit(")", 1)
            fields = tail.split()
            table.append((int(entry.name), int(fields[1]), int(fields[2]), fields[0],
                          head.split("(", 1)[1]))
        return table
    import subprocess  # only without /proc (macOS): see mlxops/node/host.py

    out = subprocess.run(["ps", "-A", "-o", "pid=,ppid=,pgid=,stat=,comm="],
                         capture_output=True, text=True, check=False).stdout
    for line in out.splitlines():
        parts = line.split(None, 4)
        if len(parts) >= 5:
            table.append((int(parts[0]), int(parts[1]), int(parts[2]), parts[3][0],
                          os.path.basename(parts[4].strip())))
    return table


def group_alive(pgid: int | None, table: Table | None = None) -> bool:
    """Whether any process of the group is alive (zombies don't count).

    Zombies matter: where nothing reaps orphans (PID 1 in some containers), a rank that
    ended stays in the process table and ``kill(0)`` alone would call it alive.
    """
    if not pgid:
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else: look at the table
    table = process_table() if table is None else table
    return any(g == pgid and state != "Z" for _, _, g, state, _ in table)


def process_alive(pid: int | None, table: Table | None = None) -> bool:
    """Whether this one process is alive (not a zombie)."""
    if not pid:
        return False
    table = process_table() if table is None else table
    return any(p == pid and state != "Z" for p, _, _, state, _ in table)


def alive(pid: int | None, table: Table | None = None) -> bool:
    """A rank is alive while its process group is (ranks mlxops spawned lead their group)
    or, for a rank another launcher started (mpirun), while its own process is."""
    if not pid:
        return False
    table = process_table() if table is None else table
    return group_alive(pid, table) or process_alive(pid, table)


def descendants(pid: int, table: Table) -> set[int]:
    """Every live process below ``pid`` in the process tree."""
    children: dict[int, list[int]] = {}
    for p, ppid, _, state, _ in table:
        if state != "Z":
            children.setdefault(ppid, []).append(p)
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def group_running(pgid: int | None, table: Table) -> bool | None:
    """Whether a process of the group is on a CPU now (state R): a rank that made no
    progress yet runs is busy (a collective spinning on a peer that is gone), one whose
    processes all sleep is idle (a collective waiting forever). One look at the table: a
    spin shows R nearly always, a wait almost never. None without a group, or with a
    process of it stopped (T: SIGSTOP, a debugger): neither busy nor waiting."""
    if not pgid:
        return None
    states = {state for _, _, g, state, _ in table if g == pgid}
    if states & {"T", "t"}:
        return None
    return "R" in states
