"""A sandbox node asleep: every process of it frozen with the cgroup freezer, then thawed.

A Mac that falls asleep keeps its TCP connections open (nothing resets them) but answers
nothing: not a new connection, not a command on an old one, not its ranks' peers. A node
whose sshd merely stopped refuses connections instead, which is a different fault
(:meth:`mlxops.sandbox.faults.Faults.stop_node`). Freezing every process of the node's
network namespace (sshd, its sessions, the job's ranks) is the Mac asleep: the kernel
still completes TCP handshakes into sshd's listen queue, and the processes resume where
they were when thawed, their peers long gone.

cgroup v1's freezer hierarchy (``freezer.state``) where it is mounted, else cgroup v2's
``cgroup.freeze``. Processes forked while the first ones are moved are caught by a second
pass; a process moved into a frozen group freezes. Needs root.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from mlxops.errors import MlxopsError
from mlxops.sandbox.cgroups import move_process, unusable_because

ROOT = Path("/sys/fs/cgroup")
V1 = ROOT / "freezer"
#: How long freezing may take (a task in an uninterruptible sleep freezes when it leaves it).
FREEZE_TIMEOUT = 10.0


def _hierarchy() -> tuple[str, Path]:
    if (V1 / "cgroup.procs").exists() and (V1 / "tasks").exists():
        return "v1", V1
    for root in (ROOT, ROOT / "unified"):
        if (root / "cgroup.controllers").exists():
            return "v2", root
    raise MlxopsError(f"{ROOT}: no cgroup freezer (v1 freezer, or v2 cgroup.freeze) to put a "
                      "node to sleep with")


def usable() -> str | None:
    """None if nodes can be frozen here, else why not."""
    return unusable_because(_hierarchy)


def freeze(name: str, pids: list[int], more: Callable[[], list[int]] | None = None) -> None:
    """Freeze ``pids`` in cgroup ``name`` (made if needed) and wait until frozen.

    ``more()``, when given, lists the node's processes again after the first move (ones
    forked meanwhile are moved too).
    """
    version, root = _hierarchy()
    group = root / name
    group.mkdir(exist_ok=True)
    for pid in pids:
        move_process(group, pid)
    for pid in (more() if more else []):
        move_process(group, pid)
    if version == "v1":
        (group / "freezer.state").write_text("FROZEN")
        done = lambda: (group / "freezer.state").read_text().strip() == "FROZEN"  # noqa: E731
    else:
        (group / "cgroup.freeze").write_text("1")
        done = lambda: "frozen 1" in (group / "cgroup.events").read_text()  # noqa: E731
    deadline = time.monotonic() + FREEZE_TIMEOUT
    while not done():
        if time.monotonic() > deadline:
            raise MlxopsError(f"cgroup {group}: not frozen after {FREEZE_TIMEOUT:.0f}s")
        time.sleep(0.01)
    for pid in (more() if more else []):
        move_process(group, pid)  # forked while freezing: frozen on arrival


def is_frozen(name: str) -> bool:
    try:
        version, root = _hierarchy()
    except MlxopsError:
        return False
    group = root / name
    if not group.exists():
        return False
    if version == "v1":
        return (group / "freezer.state").read_text().strip() != "THAWED"
    return (group / "cgroup.freeze").read_text().strip() == "1"


def thaw(name: str) -> None:
    """Thaw cgroup ``name``, move its processes back to the root group, remove it."""
    try:
        version, root = _hierarchy()
    except MlxopsError:
        return
    group = root / name
    if not group.exists():
        return
    if version == "v1":
        (group / "freezer.state").write_text("THAWED")
    else:
        (group / "cgroup.freeze").write_text("0")
    for line in (group / "cgroup.procs").read_text().split():
        move_process(root, int(line))
    try:
        group.rmdir()
    except OSError:
        pass  # a process still on its way out; an empty group left behind is harmless
