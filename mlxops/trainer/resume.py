"""Where a run starts: the checkpoint every rank agrees on, read back. One rule for the
bundled trainer and fine-tuning (:mod:`mlxops.finetune.workload`).

Every rank reads its own node's ``out/ckpt`` (the ``latest`` pointer, else the newest
complete checkpoint) and the ranks gather their steps, so that they decide together:

- without ``--resume``, an ``out`` holding a checkpoint on any rank is refused (one line,
  exit 2): starting over would overwrite it;
- with it, every rank must have found the same step (else one line: copy the newest
  checkpoint to every node); none anywhere starts at step 0;
- the checkpoint's config must agree with this one on the keys that make its state
  meaningful (the caller's ``diff_resume_keys``), else one line naming the first key.

Restoring the optimizer's state and dropping the metrics logged after the checkpoint (the
steps are redone) are alike too; what a checkpoint holds beyond weights and optimizer
state (the RNG key, the data cursor, the validation state) is each loop's own.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.optimizers as optim
from mlx.utils import tree_map_with_path

from mlxops.node import protocol
from mlxops.node.protocol.metrics import kept_through

from . import checkpoint
from .checkpoint import write_atomic
from .configfile import ConfigError
from .distributed import all_gather_cpu
from .errors import TrainerError


def agreed_checkpoint(out: str | Path, group: mx.distributed.Group, resume: bool,
                      ckpt_dir: Path | None = None, oldest: bool = False) -> Path | None:
    """The checkpoint to resume from (None: start at step 0), as every rank agrees;
    ``out`` as the config spells it (the messages name it so); ``ckpt_dir``: where this
    rank's checkpoints are (``out/ckpt``, or a pipeline stage's ``out/ckpt/stage-<s>``).

    ``oldest`` (pipeline stages, whose checkpoints launch cannot align: each node holds
    another stage's): where the ranks' newest differ (a kill while some stages wrote
    theirs), every rank takes the oldest of them, which each still holds (``keep`` >= 1
    older ones), rather than refusing."""
    directory = ckpt_dir or Path(out) / protocol.CKPT_DIR
    latest = checkpoint.find_latest(directory)
    local_step = checkpoint.load_step(latest) if latest else -1
    steps = all_gather_cpu(mx.array([local_step], dtype=mx.int32), group).tolist()
    if not resume:
        if max(steps) >= 0:
            raise ConfigError(f"{out}: out: already holds checkpoints (newest step "
                              f"{max(steps)}); pass --resume to continue, or choose "
                              "another out")
        return None
    if len(set(steps)) != 1 and oldest and min(steps) >= 0:
        older = directory / checkpoint.checkpoint_name(min(steps))
        if protocol.checkpoint_complete(older):
            return older   # every rank takes this branch: the steps are gathered
        raise TrainerError(f"{directory}: no complete checkpoint of step {min(steps)}, "
                           f"the newest every stage has (steps {steps})")
    if len(set(steps)) != 1:
        raise TrainerError(f"ranks found different latest checkpoints (steps {steps}); "
                           "copy the newest checkpoint to every node")
    return latest


def load_compatible(path: Path, diff_resume_keys: Callable[[dict[str, Any]], list[str]]
                    ) -> tuple[dict[str, mx.array], dict[str, mx.array], dict[str, Any]]:
    """``(weights, optimizer state, state)`` of the checkpoint at ``path``, refused when
    ``diff_resume_keys(its config)`` names a key that differs."""
    weights, opt, state = checkpoint.load(path)
    diff = diff_resume_keys(state["config"])
    if diff:
        raise ConfigError(f"{path / protocol.CKPT_STATE}: {diff[0]} (incompatible config)")
    return weights, opt, state


def restore_optimizer(optimizer: optim.Optimizer, saved: dict[str, mx.array],
                      trainable: dict[str, Any]) -> None:
    """The optimizer's state as saved (flat names), then ``init`` for what it lacks.

    The saved arrays are put by name into the state ``init`` shapes from ``trainable``,
    not rebuilt with ``tree_unflatten``: a pipeline stage's blocks are a dict keyed by
    their numbers in the whole model (``blocks.7``), which ``tree_unflatten`` would make
    a list from 0."""
    optimizer.init(trainable)
    shaped = tree_map_with_path(lambda path, v: saved.get(path, v), optimizer.state)
    optimizer.state = shaped
    optimizer.init(trainable)


def truncate_metrics(out: Path, step: int) -> None:
    """Drop the metrics lines logged after ``step`` (a resume from it redoes them) and a
    line torn by the crash it resumes from (:func:`protocol.metrics.kept_through`)."""
    path = out / protocol.METRICS
    if path.exists():
        write_atomic(path, kept_through(path.read_text(errors="replace"), step))
