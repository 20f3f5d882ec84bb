"""The trainer's pruning of old checkpoints: never a ``step-*`` directory missing files,
even when a rank is killed in the middle of it (a restart stops ranks at any moment)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from mlxops.node import protocol
from mlxops.trainer import checkpoint


def fake_checkpoint(ckpt: Path, step: int) -> Path:
    path = ckpt / protocol.checkpoint_name(step)
    path.mkdir(parents=True)
    for name in protocol.CKPT_FILES:
        (path / name).write_text(json.dumps({"step": step}))
    return path


def test_prune_keeps_the_newest_and_leaves_no_temporary_directory(tmp_path):
    for step in (10, 20, 30, 40):
        fake_checkpoint(tmp_path, step)
    checkpoint.prune(tmp_path, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        protocol.checkpoint_name(30), protocol.checkpoint_name(40)]


def test_a_prune_killed_midway_leaves_only_what_the_next_one_sweeps(tmp_path, monkeypatch):
    for step in (10, 20, 30):
        fake_checkpoint(tmp_path, step)
    removed = []
    real_rmtree = shutil.rmtree

    def killed_midway(path, ignore_errors=False):
        path = Path(path)
        if path.exists() and not removed:   # the first removal that does something
            os.unlink(path / protocol.CKPT_MODEL)  # one file gone, then the rank is killed
            removed.append(path)
            raise SystemExit("killed")
        return real_rmtree(path, ignore_errors=ignore_errors)

    monkeypatch.setattr(checkpoint.shutil, "rmtree", killed_midway)
    try:
        checkpoint.prune(tmp_path, keep=2)
    except SystemExit:
        pass
    monkeypatch.setattr(checkpoint.shutil, "rmtree", real_rmtree)
    steps = [p for p in tmp_path.iterdir() if protocol.checkpoint_step(p.name) is not None]
    assert steps and all(protocol.checkpoint_complete(p) for p in steps)
    assert [p.name for p in removed] == [f".tmp-{protocol.checkpoint_name(10)}-pruned"]
    checkpoint.prune(tmp_path, keep=2)   # the next one sweeps it
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        protocol.checkpoint_name(20), protocol.checkpoint_name(30)]
