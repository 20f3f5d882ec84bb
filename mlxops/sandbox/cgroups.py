"""CPU quotas and memory limits for sandbox nodes: a slower Mac, a smaller Mac, on Linux.

A node's processes (its sshd and all it started: sessions, ranks; they share the node's
network namespace) go into a cgroup of their own whose CPU bandwidth is capped at a
fraction of one CPU, or whose memory is limited (:func:`set_memory_limit`: the node's
facts read the limit as its memory, mlxops/tasks/facts.py); what the sshd forks later
inherits it. cgroup v2 (``cpu.max``) where
the unified hierarchy has the cpu controller, else v1's cpu controller
(``cpu.cfs_quota_us``), as on hybrid hosts. Needs root.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from pathlib import Path

from mlxops.errors import MlxopsError

ROOT = Path("/sys/fs/cgroup")
#: A short period: the capped node runs a little of every 20 ms, as a slower CPU would,
#: instead of its whole share of 100 ms (the kernel's default) in one burst and then
#: nothing, which made a step take one, two or three periods at random.
PERIOD_US = 20_000
#: How many times :func:`clear` and :func:`clear_memory` move a group's processes out and
#: try to remove it.
CLEAR_TRIES = 50


def _controller_hierarchy(controller: str, v1_file: str, v2_file: str,
                          purpose: str) -> tuple[str, Path]:
    """("v2", ROOT) where the unified hierarchy has ``controller``, else ("v1", its own
    mount) where that has ``v1_file``; else an error saying ``purpose`` cannot be had."""
    controllers = ROOT / "cgroup.controllers"
    if controllers.exists() and controller in controllers.read_text().split():
        return "v2", ROOT
    if (ROOT / controller / v1_file).exists():
        return "v1", ROOT / controller
    raise MlxopsError(f"{ROOT}: no cgroup {controller} controller (v2 {v2_file} or v1 "
                      f"{controller}) to set {purpose} with")


def _hierarchy() -> tuple[str, Path]:
    return _controller_hierarchy("cpu", "cpu.cfs_quota_us", "cpu.max", "a CPU quota")


def usable() -> str | None:
    """None if CPU quotas can be set here, else why not."""
    return unusable_because(_hierarchy)


def unusable_because(hierarchy: Callable[[], tuple[str, Path]]) -> str | None:
    """None if ``hierarchy()`` finds a cgroup root this process may write, else why not
    (the freezer's and the CPU quota's question, each with its own hierarchy)."""
    try:
        _, root = hierarchy()
    except MlxopsError as exc:
        return str(exc)
    if not os.access(root, os.W_OK):
        return f"{root}: not writable (root needed)"
    return None


def set_quota(name: str, pids: list[int], fraction: float) -> None:
    """Cap ``pids`` (and what they fork later) at ``fraction`` of one CPU, in cgroup
    ``name`` (made if needed)."""
    if not fraction > 0:
        raise MlxopsError(f"CPU quota: want a positive fraction of a CPU, got {fraction}")
    version, root = _hierarchy()
    group = _make_group(version, root, name, "cpu")
    quota = max(1000, int(fraction * PERIOD_US))  # the kernel's minimum is 1 ms
    if version == "v2":
        (group / "cpu.max").write_text(f"{quota} {PERIOD_US}")
    else:
        (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (group / "cpu.cfs_quota_us").write_text(str(quota))
    for pid in pids:
        move_process(group, pid)


def _make_group(version: str, root: Path, name: str, controller: str) -> Path:
    """Cgroup ``name`` under ``root`` (made if needed); on v2 ``controller`` is first
    enabled for the root's children, where a v1 mount has it already."""
    group = root / name
    group.mkdir(exist_ok=True)
    if version == "v2":
        subtree = root / "cgroup.subtree_control"
        if controller not in subtree.read_text().split():
            subtree.write_text(f"+{controller}")
    return group


def clear(name: str) -> None:
    """Move every process of cgroup ``name`` back to the root cgroup and remove it."""
    _clear(_hierarchy, name)


def _clear(hierarchy: Callable[[], tuple[str, Path]], name: str) -> None:
    """Cgroup ``name`` of ``hierarchy()`` emptied into its root and removed; none (or no
    hierarchy) is no error."""
    try:
        _, root = hierarchy()
    except MlxopsError:
        return
    group = root / name
    if not group.exists():
        return
    # A process may fork into the group while the others are moved out (a rank's helper
    # ending, a login in flight), and the kernel refuses to remove a group that still
    # has one (EBUSY, seen on a zsh node right after a job ended): move, then try again.
    for attempt in range(CLEAR_TRIES):
        for line in (group / "cgroup.procs").read_text().split():
            move_process(root, int(line))
        try:
            group.rmdir()
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or attempt == CLEAR_TRIES - 1:
                raise
            time.sleep(0.1)


def move_process(group: Path, pid: int) -> None:
    """``pid`` into cgroup ``group``; a process that ended meanwhile is no error."""
    try:
        (group / "cgroup.procs").write_text(str(pid))
    except ProcessLookupError:
        pass  # it ended meanwhile
    except OSError as exc:
        if exc.errno != 3:  # ESRCH: it ended meanwhile
            raise


def _memory_hierarchy() -> tuple[str, Path]:
    return _controller_hierarchy("memory", "memory.limit_in_bytes", "memory.max",
                                 "a memory limit")


def memory_usable() -> str | None:
    """None if memory limits can be set here, else why not."""
    return unusable_because(_memory_hierarchy)


def set_memory_limit(name: str, pids: list[int], nbytes: int) -> None:
    """Limit ``pids`` (and what they fork later) to ``nbytes`` of memory together, in
    memory cgroup ``name`` (made if needed): beyond it the kernel reclaims, then kills."""
    if nbytes <= 0:
        raise MlxopsError(f"memory limit: want a positive number of bytes, got {nbytes}")
    version, root = _memory_hierarchy()
    group = _make_group(version, root, name, "memory")
    if version == "v2":
        (group / "memory.max").write_text(str(nbytes))
    else:
        (group / "memory.limit_in_bytes").write_text(str(nbytes))
    for pid in pids:
        move_process(group, pid)


def clear_memory(name: str) -> None:
    """Move every process of memory cgroup ``name`` back to the root and remove it."""
    _clear(_memory_hierarchy, name)


def node_mount_command() -> str:
    """Shell run first in a node's private mount namespace: the memory cgroup hierarchy
    mounted again where the node looks for it. ``ip netns exec`` mounts a fresh /sys for
    the network namespace, which hides /sys/fs/cgroup, so without it a node could not read
    its own memory limit (as a container or a Linux host can). Best effort: a failure
    leaves the node without it, as before."""
    try:
        version, _ = _memory_hierarchy()
    except MlxopsError:
        return ""
    if version == "v2":
        mount = "mount -t cgroup2 cgroup2 /sys/fs/cgroup"
    else:
        mount = ("mount -t tmpfs -o mode=755 tmpfs /sys/fs/cgroup && mkdir -p "
                 "/sys/fs/cgroup/memory && mount -t cgroup -o memory cgroup "
                 "/sys/fs/cgroup/memory")
    return "{ " + mount + "; } 2>/dev/null; "

