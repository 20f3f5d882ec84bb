"""Reading a job's run directory on a node (its layout: :mod:`mlxops.node.protocol`), and
the two changes to it that are not a process's: the ``stopped`` marker and dropping
checkpoints newer than a step."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from mlxops.node import protocol


def ranks_in(run_dir: Path) -> list[int]:
    """The ranks this node runs: one start script each."""
    scripts = run_dir.glob(protocol.rank_glob(protocol.SCRIPT))
    found = (protocol.rank_of_script(p.name) for p in scripts)
    return sorted(r for r in found if r is not None)


def has_launcher(run_dir: Path) -> bool:
    """Whether this node holds an mpi job's ``launcher.sh`` (its first host does)."""
    return (run_dir / protocol.process_file(protocol.LAUNCHER, protocol.SCRIPT)).exists()


def process_path(run_dir: Path, rank: int | str, kind: str) -> Path:
    """``<run_dir>/rank-3.pid``, ``<run_dir>/launcher.log``, ..."""
    return run_dir / protocol.process_file(rank, kind)


def read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def read_pid(run_dir: Path, rank: int | str) -> int | None:
    return read_int(process_path(run_dir, rank, protocol.PID))


def mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def mark_stopped(run_dir: Path) -> None:
    if run_dir.is_dir():
        (run_dir / protocol.STOPPED_MARKER).write_text(f"{time.time()}\n")


def clear_stopped(run_dir: Path) -> None:
    (run_dir / protocol.STOPPED_MARKER).unlink(missing_ok=True)


def is_stopped(run_dir: Path) -> bool:
    return (run_dir / protocol.STOPPED_MARKER).exists()


def _checkpoint_dirs(run_dir: Path) -> list[Path]:
    """``ckpt/`` and a pipeline run's ``ckpt/stage-<s>/`` (each stage's own checkpoints)."""
    ckpt = run_dir / protocol.CKPT_DIR
    return [ckpt, *sorted(p for p in ckpt.glob("stage-*") if p.is_dir())]


def _steps(directory: Path) -> list[int]:
    found = protocol.complete_checkpoints(directory)
    return [step for step in (protocol.checkpoint_step(d.name) for d in found)
            if step is not None]


def checkpoint_steps(run_dir: Path) -> list[int]:
    """Steps of the complete checkpoints under ``ckpt/`` and its pipeline stages'
    ``ckpt/stage-<s>/`` (a step any of them has), oldest first."""
    return sorted({s for d in _checkpoint_dirs(run_dir) for s in _steps(d)})


def keep_checkpoints_up_to(run_dir: Path, step: int) -> list[int]:
    """Remove complete checkpoints newer than ``step`` (in ``ckpt/`` and every stage's
    ``ckpt/stage-<s>/``) so a resume starts where every node can.

    Other nodes lack them (a node died mid-write); the resumed run writes them again.
    """
    removed: set[int] = set()
    for ckpt in _checkpoint_dirs(run_dir):
        newer = [s for s in _steps(ckpt) if s > step]
        for s in newer:
            shutil.rmtree(ckpt / protocol.checkpoint_name(s), ignore_errors=True)
        removed.update(newer)
        if newer:
            latest = ckpt / protocol.LATEST
            tmp = latest.with_name(f".{protocol.LATEST}.tmp")
            tmp.write_text(protocol.checkpoint_name(step) + "\n")
            os.replace(tmp, latest)
    return sorted(removed)
