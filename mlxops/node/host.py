"""What kind of machine this node is, read from what it has, never from Python's build.

Node code takes a Mac's path where the node has what a Mac has, so that a node which
answers as a Mac (the sandbox's macOS flavour, mlxops/sandbox/darwin) takes the path a Mac
takes, and a Mac takes it for the same reason:

- the system's name is what the node's ``uname -s`` prints, as the controller's facts read
  it (``Darwin``, ``Linux``); ``platform.system()`` only when there is no ``uname``;
- the process table is ``/proc`` where the node has one (Linux), else ``ps`` (macOS);
- memory figures come from ``/proc/meminfo`` where it exists, else ``sysctl`` and
  ``vm_stat``; GPU figures from ``ioreg`` where the node has it.

Standard library only (synced to nodes with the other helpers).
"""

from __future__ import annotations

import functools
import shutil
from pathlib import Path

# subprocess and platform are imported where they are used: ``status``, ``stop`` and
# ``watch`` (the commands the watchdog and ``mlxops status`` ask for every few seconds) only
# look at /proc on Linux, and the two cost ~5 of a status's ~70 ms of CPU on this
# project's machine (tests/unit/node/test_node_startup.py holds it).

PROC_SELF = Path("/proc/self/stat")


@functools.lru_cache(maxsize=1)
def system() -> str:
    """``Darwin``, ``Linux``, ...: the node's ``uname -s``."""
    import platform
    import subprocess

    try:
        done = subprocess.run(["uname", "-s"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return platform.system()
    name = done.stdout.strip()
    return name if done.returncode == 0 and name else platform.system()


def has_proc() -> bool:
    """A Linux ``/proc`` (not merely a directory of that name)."""
    return PROC_SELF.exists()


def has_tool(name: str) -> bool:
    return shutil.which(name) is not None
