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


Table = list[tuple[int, int, int, str, str]]


def process_table() -> Table:
    """(pid, ppid, pgid, state, name) of every process; state 'Z' is a zombie."""
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
            head, tail = stat.rsplit(")", 1)
            fields = tail.split()
            table.append((int(entry.name), int(fields[1]), int(fields[2]), fields[0],
                          head.split("(", 1)[1]))
        return table
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


def spawn(run_dir: Path, rank: int) -> int:
    """Start ``rank-<r>.sh`` detached (see :func:`spawn_script`)."""
    return spawn_script(run_dir, f"rank-{rank}")


def spawn_script(run_dir: Path, stem: str) -> int:
    """Start ``<stem>.sh`` in its own session, detached from this (SSH) session.

    The child becomes a session and process-group leader, so killing the group later takes
    the shell and the trainer with it; its output goes to the log, its stdin is /dev/null, and
    it holds none of our file descriptors, so the SSH command returns at once. Writes
    ``<stem>.pid``; the script itself writes ``<stem>.exit``.
    """
    script = run_dir / f"{stem}.sh"
    log = run_dir / f"{stem}.log"
    pidfile = run_dir / f"{stem}.pid"
    for stale in (pidfile, run_dir / f"{stem}.exit"):
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


def rank_status(run_dir: Path, rank: int, now: float,
                table: Table | None = None) -> dict[str, Any]:
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
        "alive": alive(pid, table),
        "exit": _read_int(exit_file),
        "ended_ago": now - exit_file.stat().st_mtime if exit_file.exists() else None,
        "started": started,
        "heartbeat_age": None if beat is None else max(0.0, now - beat),
        "progress": progress if progress and (started is None or
                                               progress.get("time", 0) >= started) else None,
        "log_bytes": log.stat().st_size if log.exists() else 0,
    }


LAUNCHER = "launcher"   # launcher.sh: mpirun of an mpi job, on the job's first host


def launcher_status(run_dir: Path, now: float, table: Table | None = None
                    ) -> dict[str, Any] | None:
    """pid / alive / exit of ``launcher.sh`` (mpi jobs), None where there is none."""
    if not (run_dir / f"{LAUNCHER}.sh").exists():
        return None
    pidfile = run_dir / f"{LAUNCHER}.pid"
    exit_file = run_dir / f"{LAUNCHER}.exit"
    pid = _read_int(pidfile)
    started = pidfile.stat().st_mtime if pidfile.exists() else None
    return {
        "pid": pid,
        "alive": alive(pid, table),
        "exit": _read_int(exit_file),
        "started": started,
        "age": None if started is None else max(0.0, now - started),
        "ended_ago": now - exit_file.stat().st_mtime if exit_file.exists() else None,
    }


def status(run_dir: Path) -> dict[str, Any]:
    now = time.time()
    ranks = ranks_in(run_dir)
    table = process_table()
    answer = {
        "now": now,
        "exists": run_dir.is_dir(),
        "stopped": (run_dir / STOPPED_MARKER).exists(),
        "ranks": [rank_status(run_dir, r, now, table) for r in ranks],
        "checkpoints": checkpoint_steps(run_dir),
    }
    launcher = launcher_status(run_dir, now, table)
    if launcher is not None:
        answer["launcher"] = launcher
    return answer


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
            _signal(self.pid, sig)
        for p in self.tree:
            try:
                os.kill(p, sig)
            except (ProcessLookupError, PermissionError):
                pass


def _wait_gone(targets: dict[Any, _Target], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        table = process_table()
        if not any(t.alive(table) for t in targets.values()):
            return
        time.sleep(0.02)


def stop(run_dir: Path, grace: float) -> dict[str, Any]:
    """Stop the launcher (mpi) and every rank: SIGTERM, then SIGKILL after ``grace`` seconds.

    The launcher's group goes first (mpirun forwards the signal to every rank, on every
    node); then whatever rank is still alive, by its process group (a rank mlxops spawned)
    or by its pid and descendants (a rank mpirun started); last, an MPI daemon (orted) that
    started this node's ranks and outlived them.
    """
    if run_dir.is_dir():
        (run_dir / STOPPED_MARKER).write_text(f"{time.time()}\n")
    table = process_table()
    names = {p: n for p, _, _, _, n in table}
    parents = {p: pp for p, pp, _, _, _ in table}
    pids: dict[Any, int | None] = {r: _read_int(_pidfile(run_dir, r)) for r in ranks_in(run_dir)}
    daemons: dict[Any, _Target] = {}
    for pid in pids.values():
        parent = parents.get(pid or -1)
        if parent and names.get(parent) == "orted" and alive(pid, table):
            daemons[f"orted-{parent}"] = _Target(parent, table)
    live = {r: _Target(p, table) for r, p in pids.items() if p and alive(p, table)}
    launcher_pid = _read_int(run_dir / f"{LAUNCHER}.pid")
    deadline = time.monotonic() + grace
    if launcher_pid and alive(launcher_pid, table):
        launcher = {LAUNCHER: _Target(launcher_pid, table)}
        for sig in (signal.SIGTERM, signal.SIGCONT):
            launcher[LAUNCHER].signal(sig)
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
    return {
        "signalled": sorted(live, key=str),
        "killed": killed,
        "alive": [r for r, t in {**live, **daemons}.items() if t.alive(table)],
    }


def _signal(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def clear_stopped(run_dir: Path) -> None:
    (run_dir / STOPPED_MARKER).unlink(missing_ok=True)
