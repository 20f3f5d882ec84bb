"""Start ranks (and an mpi job's launcher) detached from the SSH session that asks: the
``spawn`` command (docs/node-protocol.md)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from mlxops.node import protocol, tempdir
from mlxops.node.rundir import clear_stopped, process_path

#: What the controller runs every helper with (transport/nodecmd.py: a helper leaves no
#: bytecode beside the synced code) and a rank must not inherit from ``spawn``: the job's
#: programs then compiled the trainer's modules from source at every start (importing its
#: entry and loop modules alone: ~125 ms of CPU without bytecode, ~97 with, in the
#: sandbox's venv on this project's machine) instead of once into ``code/``'s ``__pycache__``,
#: which every sync and check leaves alone. A job that wants it sets it in its ``env:``
#: (its rank script exports that after this), as the collectives check does.
HELPER_ONLY_ENV = ("PYTHONDONTWRITEBYTECODE",)


def rank_environment(helper: dict[str, str]) -> dict[str, str]:
    """The environment a rank's script starts in: the helper's, less its own settings."""
    return {k: v for k, v in helper.items() if k not in HELPER_ONLY_ENV}


def spawn(run_dir: Path, rank: int | str) -> int:
    """Start ``rank-<r>.sh`` (or ``launcher.sh``) in its own session, detached from this
    (SSH) session.

    The child becomes a session and process-group leader, so killing the group later takes
    the shell and the trainer with it; its output goes to the log, its stdin is /dev/null, and
    it holds none of our file descriptors, so the SSH command returns at once. Writes
    ``<stem>.pid``; the script itself writes ``<stem>.exit``.
    """
    script = process_path(run_dir, rank, protocol.SCRIPT)
    log = process_path(run_dir, rank, protocol.LOG)
    pidfile = process_path(run_dir, rank, protocol.PID)
    for stale in (pidfile, process_path(run_dir, rank, protocol.EXIT)):
        stale.unlink(missing_ok=True)
    env = rank_environment(dict(os.environ))
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.setsid()
            devnull = os.open(os.devnull, os.O_RDONLY)
            # 0600 like the rank scripts: a program's output may hold its secrets. fchmod
            # too, for a log an earlier attempt created otherwise (it is appended to).
            out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.fchmod(out, 0o600)
            os.dup2(devnull, 0)
            os.dup2(out, 1)
            os.dup2(out, 2)
            os.closerange(3, 65536)
            tmp = pidfile.with_name(pidfile.name + ".tmp")
            tmp.write_text(f"{os.getpid()}\n")
            os.replace(tmp, pidfile)
            os.execve("/bin/sh", ["/bin/sh", str(script)], env)
        finally:
            os._exit(127)
    # Parent: wait (briefly) until the child has recorded itself, so status sees it.
    deadline = time.monotonic() + 5
    while not pidfile.exists() and time.monotonic() < deadline:
        time.sleep(0.005)
    return pid


def spawn_job(run_dir: Path, ranks: list[int], launcher: bool) -> protocol.SpawnAnswer:
    """The ``spawn`` command: a new attempt is not stopped and has a temporary directory
    of its own (:mod:`mlxops.node.tempdir`: mpi ranks too, which mpirun starts later);
    start its ranks (and launcher)."""
    clear_stopped(run_dir)
    cache, refused = tempdir.prepare(run_dir)
    pids = {r: spawn(run_dir, r) for r in ranks}
    return protocol.SpawnAnswer(pids, spawn(run_dir, protocol.LAUNCHER) if launcher else None,
                                kernel_cache=cache, kernel_cache_refused=refused)
