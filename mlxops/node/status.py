"""What a node says of a job's ranks and launcher: the ``status`` command
(docs/node-protocol.md)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from mlxops.node import protocol
from mlxops.node.failure import read_failure
from mlxops.node.procs import Table, alive, group_running, process_table
from mlxops.node.rundir import (
    checkpoint_steps,
    has_launcher,
    is_stopped,
    mtime,
    process_path,
    ranks_in,
    read_int,
)
from mlxops.node.serverlog import requests_answered


def progress(run_dir: Path, rank: int) -> protocol.Progress | None:
    """The trainer's last heartbeat of ``rank``, None when it has written none (or junk)."""
    try:
        return protocol.Progress.from_dict(
            json.loads((run_dir / protocol.progress_file(rank)).read_text()))
    except (OSError, ValueError):
        return None


def rank_status(run_dir: Path, rank: int, now: float,
                table: Table | None = None) -> protocol.RankAnswer:
    pid_file = process_path(run_dir, rank, protocol.PID)
    exit_file = process_path(run_dir, rank, protocol.EXIT)
    log = process_path(run_dir, rank, protocol.LOG)
    pid = read_int(pid_file)
    started = mtime(pid_file)
    beat = progress(run_dir, rank)
    if beat is not None and started is not None and (beat.time or 0) < started:
        beat = None  # the previous attempt's
    # Heartbeat: the trainer's last progress record, or the start when it has none yet.
    last = beat.time if beat is not None and beat.time is not None else started
    is_alive = alive(pid, table)
    if pid is not None and not is_alive and not exit_file.exists():
        # ``table`` may predate the pid file: an mpi rank's script writes its own when
        # mpirun starts it, maybe after the table was read. Dead there and without an exit
        # code it would be "gone without an exit code" (failed, restarted by the
        # watchdog): look at the process itself, now that its pid file is there.
        is_alive = alive(pid)
    # After the liveness check: a script that ended wrote its exit file first.
    ended = mtime(exit_file)
    code = read_int(exit_file)
    # Why it failed, for a rank that started and ended without exit code 0. An exit code
    # says the program ended (its script records it after), so its log is whole: the log
    # is read then even while the script, the group leader, still looks alive (it is
    # about to exit, or the process table was read before it wrote the exit file).
    ended_badly = code is not None and code != 0
    failed = pid is not None and (ended_badly or (code is None and not is_alive))
    return protocol.RankAnswer(
        rank=rank, pid=pid, alive=is_alive, exit=code,
        ended_ago=None if ended is None else now - ended,
        started=started,
        heartbeat_age=None if last is None else max(0.0, now - last),
        progress=beat,
        log_bytes=log.stat().st_size if log.exists() else 0,
        failure=read_failure(log, code) if failed else None,
        busy=group_running(pid, table if table is not None else process_table())
        if is_alive else None,
    )


def launcher_status(run_dir: Path, now: float, table: Table | None = None
                    ) -> protocol.LauncherAnswer | None:
    """``launcher.sh`` (mpi jobs) like a rank; None where there is none."""
    if not has_launcher(run_dir):
        return None
    pid = read_int(process_path(run_dir, protocol.LAUNCHER, protocol.PID))
    started = mtime(process_path(run_dir, protocol.LAUNCHER, protocol.PID))
    ended = mtime(process_path(run_dir, protocol.LAUNCHER, protocol.EXIT))
    return protocol.LauncherAnswer(
        pid=pid, alive=alive(pid, table),
        exit=read_int(process_path(run_dir, protocol.LAUNCHER, protocol.EXIT)),
        started=started,
        age=None if started is None else max(0.0, now - started),
        ended_ago=None if ended is None else now - ended,
    )


def status(run_dir: Path, requests: bool = False) -> protocol.StatusAnswer:
    """The ``status`` command; ``requests``: a serve job's, whose rank 0 also says how many
    requests its server answered (:mod:`mlxops.node.serverlog`)."""
    now = time.time()
    table = process_table()
    ranks = [rank_status(run_dir, r, now, table) for r in ranks_in(run_dir)]
    for rank in ranks:
        if requests and rank.rank == 0:
            rank.requests = requests_answered(run_dir)
    return protocol.StatusAnswer(
        now=now, exists=run_dir.is_dir(), stopped=is_stopped(run_dir),
        ranks=ranks,
        checkpoints=checkpoint_steps(run_dir),
        launcher=launcher_status(run_dir, now, table),
    )


def leftovers(run_dir: Path) -> list[protocol.Leftover]:
    """Processes of the job that still run here (pre-flight refuses to start over them)."""
    if not run_dir.is_dir():
        return []
    table = process_table()
    found = [protocol.Leftover(r.rank, r.pid) for r in
             (rank_status(run_dir, rank, 0.0, table) for rank in ranks_in(run_dir))
             if r.alive and r.pid is not None]
    launcher = launcher_status(run_dir, 0.0, table)
    if launcher is not None and launcher.alive and launcher.pid is not None:
        found.append(protocol.Leftover(protocol.LAUNCHER, launcher.pid))
    return found
