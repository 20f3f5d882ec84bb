"""Atomic checkpoints: ``out/ckpt/step-XXXXXXXX/`` plus a ``latest`` pointer.

A checkpoint directory holds ``model.safetensors`` (fp32 master weights),
``optimizer.safetensors`` (AdamW moments and step), and ``state.json`` (step, data cursor,
RNG key, world size, micro/accumulation in use, the full config). It is written under
``ckpt/.tmp-step-XXXXXXXX-<pid>/``, every file fsynced, then renamed into place (atomic on
POSIX), then ``latest`` is replaced the same way. A kill at any point leaves either the old
or the new checkpoint complete; half-written ``.tmp-*`` directories are ignored and swept.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import mlx.core as mx

PREFIX = "step-"
STATE = "state.json"
FILES = ("model.safetensors", "optimizer.safetensors", STATE)


def name_for(step: int) -> str:
    return f"{PREFIX}{step:08d}"


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, text: str) -> None:
    """Write a small text file via a temporary name and a rename."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save(
    ckpt_dir: Path,
    step: int,
    weights: dict[str, mx.array],
    optimizer: dict[str, mx.array],
    state: dict[str, Any],
    keep: int,
) -> Path:
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    final = ckpt_dir / name_for(step)
    tmp = ckpt_dir / f".tmp-{name_for(step)}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    mx.save_safetensors(str(tmp / "model.safetensors"), weights)
    _fsync(tmp / "model.safetensors")
    # Test hook: widen the window in which a kill hits a half-written checkpoint.
    delay = float(os.environ.get("MLXOPS_TRAINER_CKPT_DELAY", "0") or 0)
    if delay:
        time.sleep(delay)
    mx.save_safetensors(str(tmp / "optimizer.safetensors"), optimizer)
    _fsync(tmp / "optimizer.safetensors")
    with open(tmp / STATE, "w") as f:
        json.dump(state, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    _fsync(tmp)
    if final.exists():  # a re-run of the same step (e.g. after a resume): replace it
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync(ckpt_dir)
    write_atomic(ckpt_dir / "latest", final.name + "\n")
    _fsync(ckpt_dir)
    prune(ckpt_dir, keep)
    return final


def complete(path: Path) -> bool:
    """A checkpoint directory with every file present and a parseable state.json."""
    if not path.is_dir() or not all((path / f).is_file() for f in FILES):
        return False
    try:
        json.loads((path / STATE).read_text())
    except (OSError, ValueError):
        return False
    return True


def list_complete(ckpt_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    if not ckpt_dir.is_dir():
        return []
    dirs = [p for p in ckpt_dir.iterdir() if p.name.startswith(PREFIX) and complete(p)]
    return sorted(dirs, key=lambda p: p.name)


def find_latest(ckpt_dir: Path) -> Path | None:
    """The ``latest`` pointer if it names a complete checkpoint, else the newest complete."""
    pointer = ckpt_dir / "latest"
    try:
        target = ckpt_dir / pointer.read_text().strip()
        if target.name.startswith(PREFIX) and complete(target):
            newest = list_complete(ckpt_dir)
            # A newer complete directory can exist if we died between rename and pointer.
            return newest[-1] if newest and newest[-1].name > target.name else target
    except OSError:
        pass
    found = list_complete(ckpt_dir)
    return found[-1] if found else None


def load(path: Path) -> tuple[dict[str, mx.array], dict[str, mx.array], dict[str, Any]]:
    weights = mx.load(str(path / "model.safetensors"))
    optimizer = mx.load(str(path / "optimizer.safetensors"))
    state = json.loads((path / STATE).read_text())
    return weights, optimizer, state


def prune(ckpt_dir: Path, keep: int) -> None:
    """Keep the newest ``keep`` complete checkpoints; sweep stale temporary directories."""
    for old in list_complete(ckpt_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    for tmp in ckpt_dir.glob(".tmp-*"):
        pid = tmp.name.rsplit("-", 1)[-1]
        if pid != str(os.getpid()):
            shutil.rmtree(tmp, ignore_errors=True) if tmp.is_dir() else tmp.unlink(True)


def load_step(path: Path) -> int:
    return int(json.loads((path / STATE).read_text())["step"])
