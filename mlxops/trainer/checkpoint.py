"""Atomic checkpoints: ``out/ckpt/step-XXXXXXXX/`` plus a ``latest`` pointer.

A checkpoint directory holds ``model.safetensors`` (fp32 master weights),
``optimizer.safetensors`` (AdamW moments and step), and ``state.json`` (step, data cursor,
RNG key, world size, micro/accumulation in use, the full config). It is written under
``ckpt/.tmp-step-XXXXXXXX-<pid>/``, every file fsynced, then renamed into place (atomic on
POSIX), then ``latest`` is replaced the same way. A kill at any point leaves either the old
or the new checkpoint complete; half-written ``.tmp-*`` directories are ignored and swept.

The names and the rule for a complete checkpoint are the node protocol's
(:mod:`mlxops.node.protocol`, synced beside the trainer; docs/node-protocol.md): the node
helpers read these directories for ``mlxops status`` and ``resume``.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx

from mlxops.node.protocol import (
    CKPT_MODEL,
    CKPT_OPTIMIZER,
    CKPT_STATE,
    LATEST,
    checkpoint_name,
    complete_checkpoints,
    newest_checkpoint,
)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, text: str, durable: bool = True) -> None:
    """Write a small text file via a temporary name and a rename.

    ``durable=False`` skips the fsync: for a file rewritten every step whose loss in a
    crash costs nothing (the progress heartbeat), where an fsync per step would cost
    milliseconds on a busy disk. Readers still see the old or the new file, never half.
    """
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        if durable:
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
    extra: Callable[[Path], None] | None = None,
) -> Path:
    """Write the checkpoint of ``step`` atomically and keep the newest ``keep``.

    ``extra(directory)`` writes further files into the checkpoint before it is renamed
    into place (fine-tuning's adapters in mlx-lm's format): they appear with it or not
    at all.
    """
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    final = ckpt_dir / checkpoint_name(step)
    tmp = ckpt_dir / f".tmp-{checkpoint_name(step)}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    mx.save_safetensors(str(tmp / CKPT_MODEL), weights)
    _fsync(tmp / CKPT_MODEL)
    # Test hook: widen the window in which a kill hits a half-written checkpoint.
    delay = float(os.environ.get("MLXOPS_TRAINER_CKPT_DELAY", "0") or 0)
    if delay:
        time.sleep(delay)
    mx.save_safetensors(str(tmp / CKPT_OPTIMIZER), optimizer)
    _fsync(tmp / CKPT_OPTIMIZER)
    with open(tmp / CKPT_STATE, "w") as f:
        json.dump(state, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    if extra is not None:
        extra(tmp)
    _fsync(tmp)
    if final.exists():  # a re-run of the same step (e.g. after a resume): replace it
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync(ckpt_dir)
    write_atomic(ckpt_dir / LATEST, final.name + "\n")
    _fsync(ckpt_dir)
    prune(ckpt_dir, keep)
    return final


def list_complete(ckpt_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    return complete_checkpoints(ckpt_dir)


def find_latest(ckpt_dir: Path) -> Path | None:
    """The checkpoint a run resumes from: :func:`protocol.layout.newest_checkpoint`."""
    return newest_checkpoint(ckpt_dir)


def load(path: Path) -> tuple[dict[str, mx.array], dict[str, mx.array], dict[str, Any]]:
    weights = mx.load(str(path / CKPT_MODEL))
    optimizer = mx.load(str(path / CKPT_OPTIMIZER))
    state = json.loads((path / CKPT_STATE).read_text())
    return weights, optimizer, state


def prune(ckpt_dir: Path, keep: int) -> None:
    """Keep the newest ``keep`` complete checkpoints; sweep stale temporary directories."""
    for old in list_complete(ckpt_dir)[:-keep]:
        # Renamed out of the way first (atomic), then removed: a rank killed while removing
        # leaves a `.tmp-*` directory the next prune sweeps, never a `step-*` one missing
        # files (seen: ranks stopped by a restart in the middle of a prune).
        doomed = old.with_name(f".tmp-{old.name}-pruned")
        shutil.rmtree(doomed, ignore_errors=True)
        try:
            os.replace(old, doomed)
        except OSError:
            continue
        shutil.rmtree(doomed, ignore_errors=True)
    for tmp in ckpt_dir.glob(".tmp-*"):
        pid = tmp.name.rsplit("-", 1)[-1]
        if pid != str(os.getpid()):
            shutil.rmtree(tmp, ignore_errors=True) if tmp.is_dir() else tmp.unlink(True)


def load_step(path: Path) -> int:
    return int(json.loads((path / CKPT_STATE).read_text())["step"])
