"""The processes of one sandbox's nodes, found by command line.

Every sandbox on this machine (the other xdist worker's session sandbox, another session's)
runs its nodes' processes in the one PID namespace of the machine, so ``pgrep`` alone also
finds theirs: issue 34's "all-reduce ranks still running after bench returned" were the
ranks of ``mlxops check``'s all-sum (``--sizes 4096``) in the other worker's sandbox. A
process is a node's when it runs in that node's network namespace (the inode of its
``/proc/<pid>/ns/net`` is the one ``/run/netns/<netns>`` names), as
tests/integration/test_jobs_mpi.py tells its own.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable


def node_processes(sandbox, pattern: str, nodes: Iterable[str] | None = None) -> list[str]:
    """``pgrep -af PATTERN`` lines (pid, then command line) of processes that run on
    ``nodes`` (default: all) of ``sandbox``. A zombie has no command line, so never
    matches: it runs nothing."""
    spaces = {os.stat(f"/run/netns/{sandbox.node_layout(name).netns}").st_ino
              for name in (sandbox.nodes if nodes is None else nodes)}
    out = subprocess.run(["pgrep", "-af", pattern], capture_output=True, text=True).stdout
    found = []
    for line in out.splitlines():
        try:
            if os.stat(f"/proc/{line.split()[0]}/ns/net").st_ino in spaces:
                found.append(line)
        except OSError:
            continue  # gone
    return found
