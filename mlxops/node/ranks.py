"""Start ranks detached, report on them, stop them by process group."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

STOPPED_MARKER = "stopped"


def _pidfile(run_dir: Path, rank: int) -> Path:
    return run_dir / f"rank-{rank}.pid"


def _exitfile(run_dir: Path, rank: int) -> Path:
    return run_dir / f"rank-{rank}.exit"


def ranks_in(run_dir: Path) -> list[int]:
    """The ranks this node runs: one start script each."""
    found = []
    for script in run_dir.glob("rank-*.sh"):
        try:
            found.append(int(script.stem.split("-", 1)[1]))
        except ValueError:
            continue
    return sorted(found)


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _process_table() -> list[tuple[int, int, str]]:
    """(pid, pgid, state) of every process; state 'Z' is a zombie."""
    table = []
    proc = Path("/proc")
    if proc.is_dir():  # Linux: no subprocess needed
        for entry in proc.iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            # pid (comm) state ppid pgrp ...: comm may hold spaces, so split after ')'.
            fields = stat.rsplit(")", 1)[1].split()
            table.append((int(entry.name), int(fields[2]), fields[0]))
        return table
    out = subprocess.run(["ps", "-A", "-o", "pid=,pgid=,stat="], capture_output=True,
                         text=True, check=False).stdout
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 3:
            table.append((int(parts[0]), int(parts[1]), parts[2][0]))
    return table


def group_alive(pgid: int | None, table: list[tuple[int, int, str]] | None = None) -> bool:
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
    table = _process_table() if table is None else table
    return any(g == pgid and state != "Z" for _, g, state in table)


def spawn(run_dir: Path, rank: int) -> int:
    """Start ``rank-<r>.sh`` in its own session, detached from this (SSH) session.

    The child becomes a session and process-group leader, so killing the group later takes
    the shell and the trainer with it; its output goes to the log, its stdin is /dev/null, and
    it holds none of our file descriptors, so the SSH command returns at once.
    """
    script = run_dir / f"rank-{rank}.sh"
    log = run_dir / f"rank-{rank}.log"
    pidfile = _pidfile(run_dir, rank)
    for stale in (pidfile, _exitfile(run_dir, rank)):
        stale.unlink(missing_ok=True)
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.setsid()
            devnull = os.open(os.devnull, os.O_RDONLY)
            out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(devnull, 0)
            os.dup2(out, 1)
            os.dup2(out, 2)
            os.closerange(3, 65536)
            tmp = pidfile.with_name(pidfile.name + ".tmp")
            tmp.write_text(f"{os.getpid()}\n")
            os.replace(tmp, pidfile)
            os.execv("/bin/sh", ["/bin/sh", str(script)])
        finally:
            os._exit(127)
    # Parent: wait (briefly) until the child has recorded itself, so status sees it.
    deadline = time.monotonic() + 5
    while not pidfile.exists() and time.monotonic() < deadline:
        time.sleep(0.005)
    return pid


def _progress(run_dir: Path, rank: int) -> dict[str, Any] | None:
    try:
        return json.loads((run_dir / "progress" / f"rank-{rank}.json").read_text())
    except (OSError, ValueError):
        return None


def rank_status(run_dir: Path, rank: int, now: float) -> dict[str, Any]:
    pidfile = _pidfile(run_dir, rank)
    pid = _read_int(pidfile)
    progress = _progress(run_dir, rank)
    started = pidfile.stat().st_mtime if pidfile.exists() else None
    # Heartbeat: the trainer's last progress record, or the start when it has none yet.
    beat = progress.get("time") if progress else None
    if beat is None or (started is not None and beat < started):
        beat = started
    log = run_dir / f"rank-{rank}.log"
    exit_file = _exitfile(run_dir, rank)
    return {
        "rank": rank,
        "pid": pid,
        "alive": group_alive(pid),
        "exit": _read_int(exit_file),
        "ended_ago": now - exit_file.stat().st_mtime if exit_file.exists() else None,
        "started": started,
        "heartbeat_age": None if beat is None else max(0.0, now - beat),
        "progress": progress if progress and (started is None or
                                               progress.get("time", 0) >= started) else None,
        "log_bytes": log.stat().st_size if log.exists() else 0,
    }


def status(run_dir: Path) -> dict[str, Any]:
    now = time.time()
    ranks = ranks_in(run_dir)
    return {
        "now": now,
        "exists": run_dir.is_dir(),
        "stopped": (run_dir / STOPPED_MARKER).exists(),
        "ranks": [rank_status(run_dir, r, now) for r in ranks],
        "checkpoints": checkpoint_steps(run_dir),
    }


def checkpoint_steps(run_dir: Path) -> list[int]:
    """Steps of the complete checkpoints under ``ckpt/`` (the trainer's layout), oldest first."""
    ckpt = run_dir / "ckpt"
    steps = []
    if ckpt.is_dir():
        for d in ckpt.iterdir():
            if d.name.startswith("step-") and _complete(d):
                steps.append(int(d.name.split("-", 1)[1]))
    return sorted(steps)


def _complete(d: Path) -> bool:
    files = ("model.safetensors", "optimizer.safetensors", "state.json")
    if not all((d / f).is_file() for f in files):
        return False
    try:
        json.loads((d / "state.json").read_text())
    except (OSError, ValueError):
        return False
    return True


def keep_checkpoints_up_to(run_dir: Path, step: int) -> list[int]:
    """Remove complete checkpoints newer than ``step`` so a resume starts where every node can.

    Other nodes lack them (a node died mid-write); the resumed run writes them again.
    """
    import shutil

    removed = []
    for s in checkpoint_steps(run_dir):
        if s > step:
            shutil.rmtree(run_dir / "ckpt" / f"step-{s:08d}", ignore_errors=True)
            removed.append(s)
    if removed:
        latest = run_dir / "ckpt" / "latest"
        tmp = latest.with_name(".latest.tmp")
        tmp.write_text(f"step-{step:08d}\n")
        os.replace(tmp, latest)
    return removed


def stop(run_dir: Path, grace: float) -> dict[str, Any]:
    """SIGTERM every rank's process group, SIGKILL what is left after ``grace`` seconds."""
    if run_dir.is_dir():
        (run_dir / STOPPED_MARKER).write_text(f"{time.time()}\n")
    groups = {r: _read_int(_pidfile(run_dir, r)) for r in ranks_in(run_dir)}
    live = {r: g for r, g in groups.items() if group_alive(g)}
    for pgid in live.values():
        _signal(pgid, signal.SIGTERM)
        _signal(pgid, signal.SIGCONT)  # a stopped (SIGSTOP) rank must wake up to die
    deadline = time.monotonic() + grace
    while any(group_alive(g) for g in live.values()) and time.monotonic() < deadline:
        time.sleep(0.02)
    killed = [r for r, g in live.items() if group_alive(g)]
    for r in killed:
        _signal(live[r], signal.SIGKILL)
    deadline = time.monotonic() + 5
    while any(group_alive(g) for g in live.values()) and time.monotonic() < deadline:
        time.sleep(0.02)
    return {
        "signalled": sorted(live),
        "killed": killed,
        "alive": [r for r, g in live.items() if group_alive(g)],
    }


def _signal(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def clear_stopped(run_dir: Path) -> None:
    (run_dir / STOPPED_MARKER).unlink(missing_ok=True)
