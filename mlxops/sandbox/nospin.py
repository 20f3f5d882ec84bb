"""The library a sandbox node's sessions preload so that MLX's ring ranks wait for a late
peer instead of polling their sockets without pause (``nospin.c`` has the mechanism).

Why. Sandbox nodes are processes on this machine's cores; the Macs they stand in for each
have their own. MLX's ring backend pushes bytes with one thread per socket that retries a
non-blocking ``recv``/``send`` until it moves (``SocketThread::worker``): on a Mac, a rank
whose peer is late keeps one of its own cores busy. Here it kept one of the *shared*
cores busy, taken from the peer it was waiting for. Two ranks on this 2-core machine, one
of them held 5 s before an ``all_sum``: the other spent 4.99 s of CPU waiting; with the
library 0.09 s. A 4-rank job of the tests' tiny trainer spent ~0.045 s of CPU a step per
rank, ~80% of it polling (docs/testing.md, "The suite's time").

Policy: built once per machine from the C source shipped beside this module, with the
machine's C compiler, into the sandbox cache (world-readable: the node user loads it),
under the cache's lock; the sessions of every node get it in ``LD_PRELOAD`` (sshd's
``SetEnv``: :func:`mlxops.sandbox.nodes.sshd_config`), so every rank, helper and shell
there loads it and nothing else on the machine does. A job's own ``LD_PRELOAD`` (the
OpenBLAS mlxops preloads) is put in front of it, as of any session's preload. Without a
C compiler the nodes run without it: correct, only slower (``up`` says so).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from mlxops import filelock
from mlxops.sandbox.python import CACHE_DIR

SOURCE = Path(__file__).with_name("nospin.c")


def library(cache: Path = CACHE_DIR, log=None) -> str | None:
    """The preload library's path in ``cache`` (the sandbox's, where the node interpreter
    is), built there first if needed; None when this machine has no C compiler (or the
    build failed: ``log`` is told why)."""
    source = SOURCE.read_bytes()
    built = cache / f"nospin-{hashlib.sha256(source).hexdigest()[:12]}.so"
    if built.is_file():
        return str(built)
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        if log:
            log("no C compiler: sandbox ranks poll their sockets as MLX does (slower here)")
        return None
    cache.mkdir(parents=True, exist_ok=True)
    with filelock.exclusive(cache / ".lock"):
        if built.is_file():
            return str(built)
        partial = built.with_suffix(f".{os.getpid()}.tmp")
        proc = subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-o", str(partial),
                               str(SOURCE), "-ldl"], capture_output=True, text=True)
        if proc.returncode != 0:
            partial.unlink(missing_ok=True)
            if log:
                log(f"building {built.name} failed, nodes run without it: "
                    f"{proc.stderr.strip()[-300:]}")
            return None
        partial.chmod(0o755)
        partial.replace(built)
    return str(built)
